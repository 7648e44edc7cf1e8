#!/usr/bin/env bash
# setup.sh: installs the Debian 12 packages numesh needs, only those that are missing, so it
# is quick on a machine that already has them. Runs apt-get as root, or through sudo.
#
#   scripts/setup.sh            install what is missing
#   scripts/setup.sh --check    list what is missing; exit 1 if anything is
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# Build tools and libraries (oneTBB and hwloc for the runtime, Eigen and OpenBLAS for the
# operators), PyTorch for the tests that check the operators' references against it and for
# the gloo baseline (Debian's torch runs under /usr/bin/python3), matplotlib for
# scripts/plot_benchmarks.py and its test, Oniguruma, utf8proc and SentencePiece for the tokenizers
# (python3-sentencepiece trains the SentencePiece check's model), Node.js with npm for the
# tokenizer's check against Hugging Face's tokenizers.js and for the real chat templates the
# chat template check renders with Python's jinja2 (python3-jinja2) as transformers does
# (tests/models/tokenizer_check, installed by scripts/test.sh with `npm ci`); clang with its
# sanitizer and libFuzzer runtimes for the sanitize and tsan presets and the fuzz targets;
# clang-format 14 for the format check; cpp-httplib for `numesh serve`; Chromium, its
# chromedriver and Python's Selenium for the check of `numesh serve`'s page in a real browser
# (tests/serve/web_check.py, headless); Python's headers, pybind11 and pytest for the Python
# package (python/) and its tests; Open MPI's headers and mpirun for the MPI transport and its
# tests across processes.
PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config clang libclang-rt-14-dev clang-format-14
  libfmt-dev nlohmann-json3-dev libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev
  libtbb-dev libhwloc-dev hwloc libeigen3-dev libopenblas-dev libonig-dev libutf8proc-dev libsentencepiece-dev
  libcpp-httplib-dev
  nodejs
  python3-torch python3-numpy python3-matplotlib python3-sentencepiece python3-jinja2
  python3-dev pybind11-dev python3-pytest
  libopenmpi-dev openmpi-bin
  chromium chromium-driver python3-selenium
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  status="$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)"
  [[ "$status" == installed ]] || missing+=("$pkg")
done

# npm: the nodejs package of some sources (NodeSource) ships it and conflicts with Debian's npm
# package, so Debian's npm is asked for only when no npm is there.
if ! command -v npm >/dev/null; then
  status="$(dpkg-query -W -f='${db:Status-Status}' npm 2>/dev/null || true)"
  [[ "$status" == installed ]] || missing+=(npm)
fi

if [[ ${#missing[@]} -eq 0 ]]; then
  step "all ${#PACKAGES[@]} packages are installed"
  exit 0
fi
if [[ "${1:-}" == --check ]]; then
  echo "missing: ${missing[*]}"
  exit 1
fi

step "installing ${#missing[@]} missing packages: ${missing[*]}"
sudo=()
if [[ "$(id -u)" -ne 0 ]]; then
  command -v sudo >/dev/null || die "not root and sudo is not installed; as root run:
  apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y --no-install-recommends "${missing[@]}"
step "packages installed"
