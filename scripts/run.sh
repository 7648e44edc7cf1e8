#!/usr/bin/env bash
# run.sh: the main job. Installs missing packages, configures and builds the `release`
# preset, then runs `numesh` on an example (NUMESH_EXAMPLE_ARGS in common.sh): resolve the
# semantic axes of an (8, 128, 4096) activation in train mode on eformer's five-axis mesh with
# 8 devices, printing the resolved and corrected specs and each device's slice.
#
#   scripts/run.sh               run the example below
#   scripts/run.sh ARGS...       run `numesh ARGS...` instead (e.g. `scripts/run.sh --help`)
#
# Environment: see scripts/common.sh (NUMESH_BUILD_DIR, NUMESH_JOBS, NUMESH_SKIP_SETUP).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

ensure_packages
# The main job needs no tests; scripts/test.sh configures build/release the same way.
configure_and_build release -DNUMESH_BUILD_TESTS=OFF

# The CLI belongs to tools/; find the program wherever tools/ puts it in the build tree.
dir="$(build_dir release)"
numesh_bin=""
if [[ -d "$dir/tools" ]]; then
  numesh_bin="$(find "$dir/tools" -type f -name numesh -perm -u+x -print -quit)"
fi
[[ -n "$numesh_bin" ]] || die "the numesh program was not built (no executable 'numesh' under
$dir/tools): the command-line tool has not landed yet, or NUMESH_BUILD_TOOLS is OFF"

if [[ $# -gt 0 ]]; then args=("$@"); else args=("${NUMESH_EXAMPLE_ARGS[@]}"); fi
step "numesh ${args[*]}"
"$numesh_bin" "${args[@]}"
