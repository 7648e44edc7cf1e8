#!/bin/bash
# The ggml baseline of docs/benchmarks.md ("Against llama.cpp's engine"), run beside numesh's
# own decode in one sitting:
#   bench/ggml/run.sh GGML_SOURCE [ROUNDS] [DTYPES]
# GGML_SOURCE is a checkout of github.com/ggml-org/ggml (the figures used commit d99724f). It
# builds ggml's CPU backend (Release, native) and decode_chain.cpp in a scratch folder outside
# the source tree, then alternates, ROUNDS times (3 by default), numesh's
# `bench decode --policy numa --dtypes DTYPES` (default f32,bf16; any of f32, bf16, f16, q8_0,
# q4_0, q4_k, q6_k) with decode_chain on the same model (hidden 1024, ffn 4096, kv 256, 4
# layers) in each of DTYPES. NUMESH (default build/release/tools/numesh) is the
# program measured.
set -euo pipefail
src=${1:?usage: bench/ggml/run.sh GGML_SOURCE [ROUNDS]}
rounds=${2:-3}
dtypes=${3:-f32,bf16}
here=$(cd "$(dirname "$0")" && pwd)
numesh=${NUMESH:-$here/../../build/release/tools/numesh}
work=${GGML_BUILD:-/tmp/numesh-ggml-baseline}
cmake -S "$src" -B "$work/ggml" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_BLAS=OFF \
      -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF > /dev/null
cmake --build "$work/ggml" -j2 > /dev/null
g++ -O3 -march=native -std=c++17 -I"$src/include" "$here/decode_chain.cpp" -o "$work/decode_chain" \
    -L"$work/ggml/src" -Wl,-rpath,"$work/ggml/src" -lggml -lggml-base -lggml-cpu
for r in $(seq "$rounds"); do
  echo "== round $r"
  "$numesh" bench decode --policy numa --dtypes "$dtypes" --quiet |
    grep -E "^read bandwidth| (${dtypes//,/|}) "
  for dtype in ${dtypes//,/ }; do "$work/decode_chain" "$dtype" 1024 4096 256 4 40 2; done
done
