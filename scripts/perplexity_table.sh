#!/usr/bin/env bash
# perplexity_table.sh: quality on a trained model (issue 32). Trains a small Llama with
# `numesh train` on real text, the Vim documentation that Debian's vim-runtime package ships
# (/usr/share/vim/vim90/doc/*.txt, public; 151 files, about 9.5 MB), then measures
# `numesh perplexity` on held-out text with the weights stored in each format of --dtypes and
# prints a markdown table: format, bytes per weight, perplexity, bits per byte and the change
# against f32; then the exact commands.
#
#   scripts/perplexity_table.sh [NUMESH_BINARY] [--work DIR] [--steps N] [--batch B]
#       [--tokens T] [--lr LR] [--warmup W] [--context C] [--dtypes LIST] [--retrain]
#
# Corpus and split: the files concatenated in sorted (C locale) name order; the test text is the
# last 3% of those bytes, cut at a line boundary (the tail of version9.txt, then vi_diff.txt,
# vim9.txt, vim9class.txt, visual.txt, windows.txt and workshop.txt), the training text the rest.
# The training text is cut into blocks of at least 2 KiB that end at a blank line, and the blocks
# are shuffled (Python's random.Random(1)): numesh train reads a text file's rows in order, and
# unshuffled it would see the files alphabetically, the first fifth of them in the default run.
# Tokenizer: byte level: tokenizer.json of Hugging Face's tokenizers, BPE whose vocabulary is the
# 256 bytes through GPT-2's bytes_to_unicode table (id = byte value) and no merges, ByteLevel
# pre-tokenizer (no prefix space, no regex split) and decoder, no special tokens (no BOS: the
# training rows start anywhere in the text, and so do perplexity's chunks). The perplexity is
# therefore per byte (UTF-8), and bits per byte = mean NLL / ln 2.
# Model: Llama, 6 layers, hidden 256, 8 heads / 4 kv heads of 32, intermediate 768, vocabulary
# 256, untied, rope_theta 10000 (4.85 M parameters); every matrix's rows are multiples of 256
# elements, as the K-quant formats need. Training: --init random (seed 1), AdamW (weight decay
# 0.1, clipping at 1.0), linear warm-up then cosine decay, f32, under `nice -n 5`; the defaults
# (batch 8 x 512 tokens, 500 steps, lr 2e-3, warm-up 50) take 13 minutes on 2 idle cores (2,600
# tokens/s), twice that beside a compiler; the perplexities then take about a minute a format.
# Perplexity: `numesh perplexity --context C` (llama.cpp's method: chunks of C tokens, the second
# half of each scored) for each format of --dtypes.
#
# Options:
#   --work DIR      keeps the corpus, the model and the logs [${TMPDIR:-/tmp}/numesh-perplexity]:
#                   DIR/data (train.txt, test.txt, split.json), DIR/init (config.json,
#                   tokenizer.json), DIR/model (the trained checkpoint), DIR/logs
#   --steps N       training steps [500]          --batch B    sequences a step [8]
#   --tokens T      training sequence length [512]
#   --lr LR         peak learning rate [2e-3]     --warmup W   warm-up steps [50]
#   --context C     perplexity's chunk length [512]
#   --dtypes LIST   formats, comma-separated [f32,bf16,f16,q8_0,q4_0,q4_k,q6_k] (a format
#                   the binary refuses gets a "failed" row, and the script exits 1 after the
#                   table)
#   --retrain       train again even though DIR/model holds a model trained with the same options
#                   and data (without it, such a model is reused, by whichever binary: only the
#                   perplexities run, e.g. for formats a newer numesh adds)
#
# NUMESH_BINARY defaults to build/release/tools/numesh, or build/portable/tools/numesh when there
# is no release build (under NUMESH_BUILD_DIR when that is set, as in scripts/common.sh). This
# script builds nothing; build the program first:
#   cmake --preset portable && cmake --build build/portable -j2 --target numesh
# Needs Debian's vim-runtime (apt-get install vim-runtime) and /usr/bin/python3 (standard
# library only).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

PYTHON=/usr/bin/python3
DOC_DIR=/usr/share/vim/vim90/doc
TEST_PERCENT=3
BLOCK_BYTES=2048
SHUFFLE_SEED=1
INIT_SEED=1

usage() {
  sed -n '2,/^set -euo pipefail/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
}
usage_line="usage: scripts/perplexity_table.sh [NUMESH_BINARY] [--work DIR] [--steps N] [--batch B] [--tokens T] [--lr LR] [--warmup W] [--context C] [--dtypes LIST] [--retrain]"

numesh_bin=""
work="${TMPDIR:-/tmp}/numesh-perplexity"
steps=500 batch=8 tokens=512 lr=2e-3 warmup=50 context=512
dtypes="f32,bf16,f16,q8_0,q4_0,q4_k,q6_k"
retrain=0
# need_value OPTION COUNT: dies unless OPTION has its value.
need_value() { [[ "$2" -ge 2 ]] || die "$1 needs a value ($usage_line)"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --retrain) retrain=1; shift ;;
    --work) need_value "$1" $#; work="$2"; shift 2 ;;
    --work=*) work="${1#*=}"; shift ;;
    --steps) need_value "$1" $#; steps="$2"; shift 2 ;;
    --steps=*) steps="${1#*=}"; shift ;;
    --batch) need_value "$1" $#; batch="$2"; shift 2 ;;
    --batch=*) batch="${1#*=}"; shift ;;
    --tokens) need_value "$1" $#; tokens="$2"; shift 2 ;;
    --tokens=*) tokens="${1#*=}"; shift ;;
    --lr) need_value "$1" $#; lr="$2"; shift 2 ;;
    --lr=*) lr="${1#*=}"; shift ;;
    --warmup) need_value "$1" $#; warmup="$2"; shift 2 ;;
    --warmup=*) warmup="${1#*=}"; shift ;;
    --context) need_value "$1" $#; context="$2"; shift 2 ;;
    --context=*) context="${1#*=}"; shift ;;
    --dtypes) need_value "$1" $#; dtypes="$2"; shift 2 ;;
    --dtypes=*) dtypes="${1#*=}"; shift ;;
    -*) die "unknown option '$1' ($usage_line)" ;;
    *)
      [[ -z "$numesh_bin" ]] || die "one NUMESH_BINARY only, got '$numesh_bin' and '$1'"
      numesh_bin="$1"; shift ;;
  esac
done

for pair in "steps:$steps" "batch:$batch" "tokens:$tokens" "context:$context"; do
  [[ "${pair#*:}" =~ ^[1-9][0-9]*$ ]] || die "--${pair%%:*} '${pair#*:}' must be a positive integer"
done
[[ "$warmup" =~ ^[0-9]+$ ]] || die "--warmup '$warmup' must be a non-negative integer"
(( warmup < steps )) || die "--warmup $warmup must be below --steps $steps"
[[ "$lr" =~ ^[0-9.]+([eE][-+]?[0-9]+)?$ ]] || die "--lr '$lr' must be a positive number"
[[ "$dtypes" =~ ^[a-z0-9_]+(,[a-z0-9_]+)*$ ]] || die "--dtypes '$dtypes' must be a comma-separated list, e.g. f32,q8_0"
IFS=, read -r -a dtype_list <<<"$dtypes"
[[ -n "$work" ]] || die "--work needs a folder"

if [[ -z "$numesh_bin" ]]; then
  numesh_bin="$(build_dir release)/tools/numesh"
  [[ -x "$numesh_bin" ]] || numesh_bin="$(build_dir portable)/tools/numesh"
fi
[[ -f "$numesh_bin" && -x "$numesh_bin" ]] || die "no numesh program at '$numesh_bin'. Build it first:
  cmake --preset portable && cmake --build build/portable -j2 --target numesh
or name the program: scripts/perplexity_table.sh PATH/TO/numesh"
for command in train perplexity tokenize; do
  "$numesh_bin" "$command" --help >/dev/null 2>&1 ||
    die "'$numesh_bin $command --help' failed: a numesh too old for this script?"
done
[[ -x "$PYTHON" ]] || die "$PYTHON is missing (Debian's python3)"
compgen -G "$DOC_DIR/*.txt" >/dev/null ||
  die "no Vim documentation in $DOC_DIR: install Debian's vim-runtime package (apt-get install vim-runtime)"

mkdir -p "$work"
work="$(cd "$work" && pwd)"
data="$work/data" init="$work/init" model="$work/model" logs="$work/logs"
mkdir -p "$data" "$init" "$logs"

# 1. The corpus, its split, and 2-3. the tokenizer and the model's config.json.
step "corpus: $DOC_DIR/*.txt (vim-runtime); test = last $TEST_PERCENT% cut at a line boundary"
"$PYTHON" - "$DOC_DIR" "$data" "$init" "$TEST_PERCENT" "$BLOCK_BYTES" "$SHUFFLE_SEED" \
    "$tokens" "$context" <<'EOF'
import glob
import json
import os
import random
import sys

doc_dir, data_dir, init_dir = sys.argv[1:4]
test_percent, block_bytes, seed, tokens, context = map(int, sys.argv[4:9])

# The corpus: the files in sorted byte order of their names (C locale), concatenated.
files = sorted(glob.glob(os.path.join(doc_dir, "*.txt")), key=lambda p: os.path.basename(p).encode())
parts = []
for path in files:
    with open(path, "rb") as f:
        parts.append(f.read())
corpus = b"".join(parts)
try:
    corpus.decode("utf-8")
except UnicodeDecodeError as e:
    sys.exit(f"error: the corpus is not UTF-8 at byte {e.start}; numesh's tokenizer needs UTF-8")

# The split: the test text starts after the newline at or before the last TEST_PERCENT% mark.
mark = len(corpus) - len(corpus) * test_percent // 100
cut = corpus.rfind(b"\n", 0, mark) + 1
train, test = corpus[:cut], corpus[cut:]
offsets, at = [], 0
for path, part in zip(files, parts):
    offsets.append((os.path.basename(path), at, at + len(part)))
    at += len(part)
first_test = next(name for name, start, end in offsets if start <= cut < end)
first_offset = next(cut - start for name, start, end in offsets if name == first_test)

# The training text in blocks of >= block_bytes ending at a blank line, shuffled.
lines = train.splitlines(keepends=True)
blocks, current, size = [], [], 0
for line in lines:
    current.append(line)
    size += len(line)
    if size >= block_bytes and line.strip() == b"":
        blocks.append(b"".join(current))
        current, size = [], 0
if current:
    blocks.append(b"".join(current))
random.Random(seed).shuffle(blocks)
shuffled = b"".join(blocks)
assert len(shuffled) == len(train)

with open(os.path.join(data_dir, "train.txt"), "wb") as f:
    f.write(shuffled)
with open(os.path.join(data_dir, "test.txt"), "wb") as f:
    f.write(test)
split = {
    "doc_dir": doc_dir,
    "files": len(files),
    "corpus_bytes": len(corpus),
    "train_bytes": len(train),
    "test_bytes": len(test),
    "test_percent": test_percent,
    "test_starts": f"{first_test} byte {first_offset}",
    "test_files": [first_test] + [n for n, s, e in offsets if s > cut],
    "train_blocks": len(blocks),
    "block_bytes": block_bytes,
    "shuffle_seed": seed,
}
with open(os.path.join(data_dir, "split.json"), "w") as f:
    json.dump(split, f, indent=2)
print(f"{len(files)} files, {len(corpus)} bytes: training text {len(train)} bytes "
      f"({len(blocks)} shuffled blocks of >= {block_bytes} bytes ending at a blank line), "
      f"test text {len(test)} bytes ({len(test) * 100 / len(corpus):.2f}%, from {first_test} "
      f"byte {first_offset} to the end: {', '.join(split['test_files'])})")

# The byte-level tokenizer: GPT-2's bytes_to_unicode, id = byte value, no merges.
def bytes_to_unicode():
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1))
          + list(range(ord("\u00ae"), ord("\u00ff") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


table = bytes_to_unicode()
byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
tokenizer = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": [],
    "normalizer": None,
    "pre_tokenizer": byte_level,
    "post_processor": None,
    "decoder": byte_level,
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
              "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
              "ignore_merges": False, "vocab": {table[b]: b for b in range(256)}, "merges": []},
}
with open(os.path.join(init_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
    json.dump(tokenizer, f, ensure_ascii=False, indent=1)

config = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "vocab_size": 256,
    "hidden_act": "silu",
    "max_position_embeddings": max(1024, tokens, context),
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
}
with open(os.path.join(init_dir, "config.json"), "w") as f:
    json.dump(config, f, indent=2)
EOF

# The tokenizer as numesh reads it: a sample with multi-byte characters encodes to its bytes and
# decodes back.
step "tokenizer check: numesh tokenize encodes to the bytes and decodes back"
sample="$(head -n 8 "$data/test.txt")"$'\n'"Umlauts äöü, a dash — and a check ✓ 𝄞"
encoded="$("$numesh_bin" tokenize --model "$init" --text "$sample" --json)" ||
  die "numesh tokenize refuses $init/tokenizer.json"
ids="$("$PYTHON" -c '
import json, sys
ids = json.loads(sys.argv[1])["ids"]
want = list(sys.argv[2].encode())
if ids != want:
    sys.exit(f"error: numesh encodes the sample to {len(ids)} ids, not to its {len(want)} bytes")
print(",".join(map(str, ids)))' "$encoded" "$sample")"
decoded="$("$numesh_bin" tokenize --model "$init" --decode "$ids" --json)"
"$PYTHON" -c '
import json, sys
if json.loads(sys.argv[1])["text"] != sys.argv[2]:
    sys.exit("error: numesh does not decode the sample back to itself")' "$decoded" "$sample"
echo "a sample of ${#sample} characters (the test text's first 8 lines and some multi-byte ones):" \
     "$(awk -F, '{print NF}' <<<"$ids") ids, one a byte; decoded back unchanged"

# 4. Training.
# show_progress: the lines of numesh train's output as they come, of the step lines only the
# first, the last and every 25th.
show_progress() {
  local line
  while IFS= read -r line; do
    if [[ "$line" =~ ^step\ ([0-9]+)/([0-9]+)\  ]] &&
       (( BASH_REMATCH[1] % 25 != 0 && BASH_REMATCH[1] != 1 && BASH_REMATCH[1] != BASH_REMATCH[2] )); then
      continue
    fi
    printf '%s\n' "$line"
  done
}
train_cmd=(nice -n 5 "$numesh_bin" train --model "$init" --init random --seed "$INIT_SEED"
           --data "$data/train.txt" --tokens "$tokens" --batch "$batch" --steps "$steps"
           --lr "$lr" --warmup "$warmup" --schedule cosine --weight-decay 0.1 --clip 1.0
           --log "$logs/train.csv" --save "$model")
# The training options and inputs (not the binary: a newer numesh reuses the model).
stamp="$(printf '%q ' "${train_cmd[@]:4}"; echo; sha256sum "$data/train.txt" "$init/config.json" "$init/tokenizer.json" | cut -d' ' -f1)"
if [[ "$retrain" == 0 && -f "$model/model.safetensors" && -f "$model/train_stamp.txt" &&
      "$(cat "$model/train_stamp.txt")" == "$stamp" ]]; then
  step "training: reusing $model (trained with the same command and data; --retrain to train again)"
else
  step "training: $steps steps of $batch x $tokens tokens (progress every 25 steps; all in $logs/train.out)"
  rm -rf "$model" "$logs/train.csv"
  start=$SECONDS
  # numesh train shows each step on stderr; this keeps every 25th and the summary lines.
  if ! "${train_cmd[@]}" 2>&1 | tee "$logs/train.out" | show_progress; then
    tail -n 20 "$logs/train.out" >&2
    die "training failed: ${train_cmd[*]}"
  fi
  echo "$((SECONDS - start))" >"$logs/train_seconds.txt"
  printf '%s\n' "$stamp" >"$model/train_stamp.txt"
fi
[[ -f "$model/model.safetensors" ]] || die "training wrote no $model/model.safetensors"
[[ -f "$model/tokenizer.json" ]] || cp "$init/tokenizer.json" "$model/"

step "a greedy sample from the trained model (prompt: the test text's first line)"
prompt="$(head -n 1 "$data/test.txt")"
"$numesh_bin" generate --model "$model" --prompt "$prompt" --max-new-tokens 200 --quiet \
    >"$logs/sample.out" 2>&1 || { cat "$logs/sample.out" >&2; die "numesh generate failed"; }
sed -n '/^text /,/^prefill /{/^prefill /d;p}' "$logs/sample.out"

# 5. Perplexity for each format.
failed=0
ppl_cmds=()
for dtype in "${dtype_list[@]}"; do
  cmd=(nice -n 5 "$numesh_bin" perplexity --model "$model" --text-file "$data/test.txt"
       --context "$context" --dtype "$dtype" --json "$logs/perplexity-$dtype.json")
  ppl_cmds+=("$(printf '%q ' "${cmd[@]:3}" --quiet | sed 's/ $//')")
  step "perplexity, $dtype weights"
  rm -f "$logs/perplexity-$dtype.json"
  if "${cmd[@]}" --quiet >"$logs/perplexity-$dtype.out" 2>&1; then
    grep -E '^perplexity ' "$logs/perplexity-$dtype.out"
  else
    tail -n 3 "$logs/perplexity-$dtype.out" >&2
    echo "($dtype failed; the table says so)" >&2
    failed=1
  fi
done

step "results"
{ printf '%q ' "${train_cmd[@]:3}" | sed 's/ $//'; echo; printf '%s\n' "${ppl_cmds[@]}"; } >"$logs/commands.txt"
"$PYTHON" - "$work" "$dtypes" "$NUMESH_ROOT" "$numesh_bin" <<'EOF'
import csv
import json
import math
import os
import statistics
import sys

work, dtypes, root, numesh_bin = sys.argv[1:5]
data, init, model, logs = (os.path.join(work, d) for d in ("data", "init", "model", "logs"))
BYTES_PER_WEIGHT = {"f32": 4.0, "bf16": 2.0, "f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32,
                    "q4_1": 20 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32, "q8_k": 292 / 256,
                    "q2_k": 84 / 256, "q3_k": 110 / 256, "q4_k": 144 / 256, "q5_k": 176 / 256,
                    "q6_k": 210 / 256}

with open(os.path.join(data, "split.json")) as f:
    split = json.load(f)
with open(os.path.join(model, "config.json")) as f:
    c = json.load(f)
h, i, n, v = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
d, heads, kv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
per_layer = h * d * heads * 2 + h * d * kv * 2 + 3 * h * i + 2 * h
params = n * per_layer + 2 * v * h + h
matrices = n * (h * d * heads * 2 + h * d * kv * 2 + 3 * h * i)

with open(os.path.join(logs, "train.csv")) as f:
    rows = list(csv.DictReader(f))
loss = [float(r["loss"]) for r in rows]
tps = [float(r["tokens_per_second"]) for r in rows]
seconds_file = os.path.join(logs, "train_seconds.txt")
wall = int(open(seconds_file).read()) if os.path.exists(seconds_file) else None

print(f"Corpus: {split['files']} files of {split['doc_dir']}/*.txt "
      f"(Debian's vim-runtime), {split['corpus_bytes']} bytes in sorted name order; training text "
      f"{split['train_bytes']} bytes (the first {100 - split['test_percent']}%, cut at a line "
      f"boundary; {split['train_blocks']} blocks of >= {split['block_bytes']} bytes ending at a "
      f"blank line, shuffled with seed {split['shuffle_seed']}), test text {split['test_bytes']} "
      f"bytes (from {split['test_starts']} to the end: {', '.join(split['test_files'])}).")
print(f"Tokenizer: byte level (256 ids, one a byte, no merges, no BOS), so perplexity is per byte.")
print(f"Model: Llama, {n} layers, hidden {h}, heads {heads}/{kv} x {d}, intermediate {i}, "
      f"vocabulary {v}, untied: {params} parameters ({params / 1e6:.2f} M; {matrices / 1e6:.2f} M "
      f"in the layers' matrices).")
k = max(1, len(loss) // 20)
print(f"Training: {len(loss)} steps, loss {loss[0]:.3f} at step 1 (ln 256 = {math.log(256):.3f}) -> "
      f"{loss[-1]:.3f} at step {len(loss)} (mean of the last {k}: {statistics.mean(loss[-k:]):.3f}); "
      f"median {statistics.median(tps):.0f} tokens/s"
      + (f"; wall time {wall // 60} min {wall % 60} s." if wall is not None else "."))
marks = sorted({max(1, round(len(loss) * q / 10)) for q in range(0, 11)})
print("Loss by step: " + ", ".join(f"{s}: {loss[s - 1]:.3f}" for s in marks))
print()

results = {}
for dtype in dtypes.split(","):
    path = os.path.join(logs, f"perplexity-{dtype}.json")
    if os.path.exists(path):
        with open(path) as f:
            results[dtype] = json.load(f)
base = results.get("f32")
any_result = next(iter(results.values()), None)
if any_result:
    print(f"Perplexity: numesh perplexity --context {any_result['context']}, {any_result['chunks']} "
          f"chunks, {any_result['scored_tokens']} scored bytes of the test text; the weights stored "
          f"as the format says (quantized at load; norms stay f32).")
    print()
print("| weights | bytes per weight | perplexity | bits per byte | vs f32 |")
print("|---|---:|---:|---:|---:|")
for dtype in dtypes.split(","):
    bpw = BYTES_PER_WEIGHT.get(dtype)
    bpw_text = f"{bpw:.4f}".rstrip("0").rstrip(".") if bpw is not None else "?"
    r = results.get(dtype)
    if r is None:
        print(f"| {dtype} | {bpw_text} | failed (see {logs}/perplexity-{dtype}.out) | | |")
        continue
    change = (f"{(r['perplexity'] / base['perplexity'] - 1) * 100:+.3f}%" if base else "-")
    print(f"| {dtype} | {bpw_text} | {r['perplexity']:.4f} +/- {r['standard_error']:.4f} "
          f"| {r['mean_nll'] / math.log(2):.4f} | {change} |")
print()
shown = os.path.relpath(numesh_bin, root) if numesh_bin.startswith(root + "/") else numesh_bin
print(f"Commands (numesh is {shown}, WORK is {work}; scripts/perplexity_table.sh runs them under "
      f"nice -n 5):")
print()
print("```sh")
with open(os.path.join(logs, "commands.txt")) as f:
    for line in f:
        print(line.rstrip("\n").replace(numesh_bin, "numesh", 1).replace(work, "$WORK"))
print("```")
EOF
(( failed == 0 )) || die "some formats failed (see the table)"
