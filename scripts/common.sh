# shellcheck shell=bash
# Shared helpers for scripts/*.sh. Sourced, not run.
#
# Environment (all optional):
#   NUMESH_BUILD_DIR   root of the build folders; preset P builds in $NUMESH_BUILD_DIR/P
#                      [<source>/build, the presets' own binaryDir]
#   NUMESH_JOBS        parallel build jobs [number of CPUs]
#   NUMESH_SKIP_SETUP  1: do not check or install system packages

NUMESH_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NUMESH_BUILD_ROOT="$(realpath -m "${NUMESH_BUILD_DIR:-$NUMESH_ROOT/build}")"
NUMESH_JOBS="${NUMESH_JOBS:-$(nproc 2>/dev/null || echo 2)}"

# The main job's example (README.md shows the same command): resolve the semantic axes of an
# (8, 128, 4096) activation in train mode on eformer's five-axis mesh with 8 devices.
# shellcheck disable=SC2034,SC2054  # used by run.sh and test.sh; the commas are option values
NUMESH_EXAMPLE_ARGS=(resolve --axes batch,query_length,embed --mode train
                     --mesh-dims 1,2,1,-1,1 --mesh-names dp,fsdp,ep,tp,sp --devices 8
                     --shape 8,128,4096)

# run.sh's release build: the tools and the Google Benchmark programs, no tests.
# shellcheck disable=SC2034  # used by run.sh
NUMESH_RELEASE_FLAGS=(-DNUMESH_BUILD_TESTS=OFF -DNUMESH_BUILD_BENCHMARKS=ON)

# ccache (the presets' compiler launcher) needs somewhere to keep its cache, even where HOME
# is unset.
if [[ -z "${CCACHE_DIR:-}" && -z "${HOME:-}" ]]; then
  export CCACHE_DIR=/tmp/numesh-ccache
fi

# step "text": a progress line that stands out in CI logs, with the seconds since the script
# began (so that a log tells where the time of a run went).
step() { printf '\n==> [%s %d s] %s\n' "$(basename "$0")" "$SECONDS" "$*"; }
# die "text": an error line on stderr, then exit 1.
die() { printf 'error: [%s] %s\n' "$(basename "$0")" "$*" >&2; exit 1; }

# build_dir PRESET: where PRESET builds.
build_dir() { printf '%s/%s' "$NUMESH_BUILD_ROOT" "$1"; }

# ensure_packages: install the Debian packages the project needs, if any is missing.
ensure_packages() {
  if [[ "${NUMESH_SKIP_SETUP:-0}" == 1 ]]; then
    step "skipping package check (NUMESH_SKIP_SETUP=1)"
    return
  fi
  bash "$NUMESH_ROOT/scripts/setup.sh"
}

# configure_and_build PRESET [cmake -D args...]: configure PRESET into its build folder and
# build it.
configure_and_build() {
  local preset="$1"; shift
  local dir; dir="$(build_dir "$preset")"
  step "configure preset '$preset' in $dir"
  cmake -S "$NUMESH_ROOT" --preset "$preset" -B "$dir" "$@"
  step "build preset '$preset' (-j$NUMESH_JOBS)"
  cmake --build "$dir" -j "$NUMESH_JOBS"
}
