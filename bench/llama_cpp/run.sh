#!/bin/bash
# numesh against llama.cpp end to end on the same GGUF files (docs/benchmarks.md, "End to end
# against llama.cpp"), alternated in one sitting:
#   bench/llama_cpp/run.sh NODE_MODULES MODEL [ROUNDS] [TYPES]
# NODE_MODULES is a node_modules folder where `npm install node-llama-cpp` put llama.cpp's
# prebuilt CPU libraries (@node-llama-cpp/linux-x64) and its source bundle (for the headers;
# the figures used node-llama-cpp 3.22.1, llama.cpp release v0.5.0). MODEL is a Hugging Face
# folder with a tokenizer (tokenizer.json or tokenizer.model: llama.cpp loads no GGUF without
# one). For each of TYPES (default q8_0,q4_0,bf16,f32) the model is written by
# `numesh convert`, then, ROUNDS times (3 by default), numesh generate and llama_bench.cpp each
# prefill the same PROMPT_TOKENS ids (default 256; both run a longer prompt in chunks of 512,
# llama.cpp's n_ubatch and numesh's --prefill-chunk) and decode 128 greedy tokens on 2 threads.
# NUMESH (default build/release/tools/numesh) is the program measured; scratch files go to
# LLAMA_BENCH_WORK (default /tmp/numesh-llama-cpp-baseline). LLAMA_CPU_LIBS (default the
# package's own folder) names a folder of the same libraries with one CPU variant alone: ggml loads the best variant
# the CPU runs, so a folder holding only libggml-cpu-haswell.so beside the others measures
# llama.cpp's AVX2 build on an AVX-512 machine (run numesh with NUMESH_KERNELS=avx2 beside it).
# A type llama-q3_k_m, llama-q4_k_m, llama-q5_k_m, llama-iq4_nl or llama-iq4_xs is llama.cpp's mixture of that name written
# by llama.cpp's own quantizer (quantize.cpp, llama_model_quantize) from numesh's f32 file: the
# file a llama.cpp user would have, read by both engines.
set -euo pipefail
modules=${1:?usage: bench/llama_cpp/run.sh NODE_MODULES MODEL [ROUNDS] [TYPES]}
model=${2:?usage: bench/llama_cpp/run.sh NODE_MODULES MODEL [ROUNDS] [TYPES]}
rounds=${3:-3}
types=${4:-q8_0,q4_0,bf16,f32}
prompt=${PROMPT_TOKENS:-256}
here=$(cd "$(dirname "$0")" && pwd)
numesh=${NUMESH:-$here/../../build/release/tools/numesh}
work=${LLAMA_BENCH_WORK:-/tmp/numesh-llama-cpp-baseline}
libs=${LLAMA_CPU_LIBS:-$modules/@node-llama-cpp/linux-x64/bins/linux-x64}
mkdir -p "$work"
[ -d "$work/llama.cpp" ] || git clone -q "$modules/node-llama-cpp/llama/gitRelease.bundle" "$work/llama.cpp"
g++ -O2 -std=c++17 -I"$work/llama.cpp/include" -I"$work/llama.cpp/ggml/include" \
    "$here/llama_bench.cpp" -o "$work/llama_bench" "$libs"/libllama.v*.so "$libs"/libggml.v*.so \
    "$libs/libggml-base.so" -Wl,-rpath,"$libs"
vocab=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$model/config.json")
python3 -c "import random,sys; random.seed(7); print(','.join(str(random.randrange(3, int(sys.argv[1]))) for _ in range(int(sys.argv[2]))))" \
    "$vocab" "$prompt" > "$work/ids.txt"
for t in ${types//,/ }; do
  case "$t" in
    llama-q3_k_m) ftype=12 ;;
    llama-q4_k_m) ftype=15 ;;
    llama-q5_k_m) ftype=17 ;;
    llama-iq4_nl) ftype=25 ;;
    llama-iq4_xs) ftype=30 ;;
    llama-*) echo "run.sh: unknown llama.cpp mixture $t (llama-q3_k_m, llama-q4_k_m, llama-q5_k_m, llama-iq4_nl, llama-iq4_xs)" >&2; exit 2 ;;
    *) "$numesh" convert --model "$model" --out "$work/model-$t.gguf" --type "$t" --quiet; continue ;;
  esac
  [ -x "$work/quantize" ] || g++ -O2 -std=c++17 -I"$work/llama.cpp/include" -I"$work/llama.cpp/ggml/include" \
      "$here/quantize.cpp" -o "$work/quantize" "$libs"/libllama.v*.so "$libs"/libggml.v*.so \
      "$libs/libggml-base.so" -Wl,-rpath,"$libs"
  if [ -z "${f32_written:-}" ]; then  # once a run: the source of every mixture, this model's
    "$numesh" convert --model "$model" --out "$work/mixture-source-f32.gguf" --type f32 --quiet
    f32_written=1
  fi
  "$work/quantize" "$work/mixture-source-f32.gguf" "$work/model-$t.gguf" "$ftype" > "$work/quantize.log" 2>&1
done
for r in $(seq "$rounds"); do
  for t in ${types//,/ }; do
    "$numesh" generate --model "$work/model-$t.gguf" --ids "$(cat "$work/ids.txt")" --max-new-tokens 128 \
        --quiet --json "$work/numesh.json" > /dev/null
    "$work/llama_bench" "$libs" "$work/model-$t.gguf" "$work/ids.txt" 128 2 > "$work/llama.json" 2> /dev/null
    python3 - "$t" "$r" "$work/numesh.json" "$work/llama.json" <<'PY'
import json, sys
t, r, a, b = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3])), json.load(open(sys.argv[4]))
ids = a["sequences"][0]["ids"]
agree = next((i for i, (x, y) in enumerate(zip(ids, b["ids"])) if x != y), len(ids))
p, q = a["prefill_tokens_per_second"], b["prefill_tokens_per_second"]
d, e = a["decode_tokens_per_second"], b["decode_tokens_per_second"]
print(f"{t:12s} round {r}: prefill numesh {p:7.1f} llama.cpp {q:7.1f} tokens/s ({p / q:.2f}x); "
      f"decode numesh {d:6.1f} llama.cpp {e:6.1f} ({d / e:.2f}x); greedy ids agree for {agree} of {len(ids)}")
PY
  done
done
