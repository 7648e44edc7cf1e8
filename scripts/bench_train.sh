#!/usr/bin/env bash
# bench_train.sh: measures `numesh train` against PyTorch's training step in one sitting, on the
# dense Llama of `numesh run`'s default shape (hidden 512, 4 layers, 8 heads / 4 kv heads of 64,
# intermediate 1536, vocabulary 8192, untied; about 21 M parameters), batch 4 x 128 tokens, fp32,
# AdamW (lr 3e-4, weight decay 0.1) with clipping at 1.0. In a temporary folder it writes the
# model's config.json and random training ids (data.npy, int32 [64, 129]), then runs, alternated
# for R rounds so that the machine's drift hits every configuration alike:
#   1. numesh train on the machine's default mesh (--init random), its CSV log read back;
#   2. PyTorch in one process, its best configuration on this machine kind
#      (OPENBLAS_NUM_THREADS=2, set_num_threads(1); docs/benchmarks.md, "PyTorch's configuration");
#   3. PyTorch in one process, OPENBLAS_NUM_THREADS=1, set_num_threads(2);
#   4. PyTorch DistributedDataParallel, gloo, 2 ranks of 1 thread (OPENBLAS_NUM_THREADS=1),
#   5. numesh train --dtype bf16 (bf16 compute on fp32 master weights: twice the fp32 rate on CPUs
#      with AVX-512 BF16, no faster elsewhere),
#   6. numesh train in one process of two devices (--policy core --dims -1,1,1: data parallel),
#   7. numesh train as two ranks of one device each (mpirun -np 2 --bind-to core, --dims -1,1,1:
#      data parallel across processes, as DDP is; skipped without mpirun),
# and once, after the rounds, the GEMM ceiling: torch.mm of the MLP's up-projection
# [B*T, hidden] x [hidden, intermediate] in the best configuration. Prints a markdown table
# (median tokens/s over the rounds, ms a step, numesh's ratio to each, model FLOP/s as
# 6 x parameters x tokens/s and its fraction of the GEMM ceiling) and the exact commands.
# Each figure is the median step after the first 3 (warm-up) of --steps steps.
#
#   scripts/bench_train.sh [NUMESH_BINARY] [--steps N] [--rounds R]
#
# NUMESH_BINARY defaults to build/release/tools/numesh (under NUMESH_BUILD_DIR when that is set,
# as in scripts/common.sh). This script builds nothing; build the program first:
#   cmake --preset release -DNUMESH_BUILD_BENCHMARKS=ON && cmake --build build/release -j2 --target numesh
# PyTorch runs under /usr/bin/python3 (Debian's python3-torch, torch 1.13, and python3-numpy).
#
# Environment (optional):
#   NUMESH_BENCH_TINY  1: a tiny model instead (hidden 64, 2 layers, vocabulary 256, batch
#                      4 x 16 tokens, 4 steps unless --steps), to check this script in seconds
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

PYTHON=/usr/bin/python3
WARMUP=3

usage() {
  sed -n '2,/^set -euo pipefail/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
}

numesh_bin=""
steps=""
rounds=2
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --steps) [[ $# -ge 2 ]] || die "--steps needs a value"; steps="$2"; shift 2 ;;
    --steps=*) steps="${1#--steps=}"; shift ;;
    --rounds) [[ $# -ge 2 ]] || die "--rounds needs a value"; rounds="$2"; shift 2 ;;
    --rounds=*) rounds="${1#--rounds=}"; shift ;;
    -*) die "unknown option '$1' (usage: scripts/bench_train.sh [NUMESH_BINARY] [--steps N] [--rounds R])" ;;
    *)
      [[ -z "$numesh_bin" ]] || die "one NUMESH_BINARY only, got '$numesh_bin' and '$1'"
      numesh_bin="$1"; shift ;;
  esac
done

tiny="${NUMESH_BENCH_TINY:-0}"
if [[ "$tiny" == 1 ]]; then
  hidden=64 intermediate=192 layers=2 heads=4 kv_heads=2 head_dim=16 vocab=256
  batch=4 tokens=16 rows=16
  steps="${steps:-4}"
else
  hidden=512 intermediate=1536 layers=4 heads=8 kv_heads=4 head_dim=64 vocab=8192
  batch=4 tokens=128 rows=64
  steps="${steps:-10}"
fi
if ! [[ "$steps" =~ ^[0-9]+$ ]] || (( steps <= WARMUP )); then
  die "--steps '$steps' must be an integer above $WARMUP: the first $WARMUP steps are warm-up"
fi
if ! [[ "$rounds" =~ ^[0-9]+$ ]] || (( rounds < 1 )); then
  die "--rounds '$rounds' must be a positive integer"
fi

numesh_bin="${numesh_bin:-$(build_dir release)/tools/numesh}"
[[ -f "$numesh_bin" && -x "$numesh_bin" ]] || die "no numesh program at '$numesh_bin'. Build it first:
  cmake --preset release -DNUMESH_BUILD_BENCHMARKS=ON && cmake --build build/release -j2 --target numesh
or name the program: scripts/bench_train.sh PATH/TO/numesh"
train_help="$("$numesh_bin" train --help 2>&1)" ||
  die "'$numesh_bin train --help' failed: this numesh has no train command?
$train_help"
for flag in --model --init --seed --data --batch --steps --lr --weight-decay --clip --log --quiet; do
  grep -q -- "$flag\b" <<<"$train_help" || die "'$numesh_bin train --help' does not list $flag: a numesh too old for this script?"
done
[[ -x "$PYTHON" ]] || die "$PYTHON is missing (PyTorch runs under Debian's python3 with python3-torch)"
"$PYTHON" -c 'import torch, numpy' 2>/dev/null ||
  die "$PYTHON cannot import torch and numpy (apt-get install python3-torch python3-numpy)"
torch_bench="$NUMESH_ROOT/bench/train_torch.py"
[[ -f "$torch_bench" ]] || die "$torch_bench is missing"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/numesh-bench-train.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
model="$tmp/model"
mkdir -p "$model"

# The model's config.json and the training ids.
"$PYTHON" - "$model/config.json" "$tmp/data.npy" "$hidden" "$intermediate" "$layers" "$heads" \
    "$kv_heads" "$head_dim" "$vocab" "$rows" "$tokens" <<'EOF'
import json
import sys

import numpy as np

config_path, data_path = sys.argv[1], sys.argv[2]
hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, rows, tokens = map(int, sys.argv[3:])
config = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": hidden,
    "intermediate_size": intermediate,
    "num_hidden_layers": layers,
    "num_attention_heads": heads,
    "num_key_value_heads": kv_heads,
    "head_dim": head_dim,
    "vocab_size": vocab,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
with open(config_path, "w") as f:
    json.dump(config, f, indent=2)
rng = np.random.default_rng(1)
np.save(data_path, rng.integers(0, vocab, size=(rows, tokens + 1), dtype=np.int32))
EOF

# run_logged NAME CMD...: runs CMD with its output in $tmp/NAME.out; on failure shows it and exits.
run_logged() {
  local name="$1"; shift
  if ! "$@" >"$tmp/$name.out" 2>&1; then
    tail -n 30 "$tmp/$name.out" >&2
    die "$name failed: $*"
  fi
}

# The configurations: a label, the environment and the command; "numesh" is read from its CSV.
labels=("numesh train (default mesh)"
        "PyTorch 1 process, OPENBLAS_NUM_THREADS=2, set_num_threads(1)"
        "PyTorch 1 process, OPENBLAS_NUM_THREADS=1, set_num_threads(2)"
        "PyTorch DDP gloo, 2 ranks x 1 thread, OPENBLAS_NUM_THREADS=1"
        "numesh train --dtype bf16 (default mesh)"
        "numesh train, 1 process of 2 devices (dp=2)"
        "numesh train, 2 ranks x 1 device (mpirun --bind-to core, dp=2)")
names=(numesh torch-best torch-threads2 torch-ddp2 numesh-bf16 numesh-2devices numesh-2ranks)
configs=(0 1 2 3 4 5 6)
# mpirun as root needs Open MPI's consent; containers without cross-memory attach need the
# shared-memory transport's copy-in/copy-out.
mpirun_cmd=()
if command -v mpirun >/dev/null; then
  mpirun_cmd=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
              OMPI_MCA_btl_vader_single_copy_mechanism=none mpirun -np 2 --bind-to core)
else
  configs=(0 1 2 3 4 5)
  echo "note: no mpirun: the two-rank configuration is skipped" >&2
fi
torch_common=("$PYTHON" "$torch_bench" --config "$model/config.json" --batch "$batch" --tokens "$tokens"
              --steps "$steps" --warmup "$WARMUP" --lr 3e-4 --weight-decay 0.1 --clip 1.0)
numesh_cmd=("$numesh_bin" train --model "$model" --init random --seed 1 --data "$tmp/data.npy"
            --batch "$batch" --steps "$steps" --lr 3e-4 --weight-decay 0.1 --clip 1.0 --quiet)
# config_cmd I ROUND: sets cmds to the command of configuration I in ROUND (env first for PyTorch).
cmds=()
config_cmd() {
  local r="$2"
  case "$1" in
    0) cmds=("${numesh_cmd[@]}" --log "$tmp/numesh-$r.csv") ;;
    1) cmds=(env OPENBLAS_NUM_THREADS=2 "${torch_common[@]}" --threads 1 --json "$tmp/torch-best-$r.json") ;;
    2) cmds=(env OPENBLAS_NUM_THREADS=1 "${torch_common[@]}" --threads 2 --json "$tmp/torch-threads2-$r.json") ;;
    3) cmds=(env OPENBLAS_NUM_THREADS=1 "${torch_common[@]}" --threads 1 --ddp 2 --json "$tmp/torch-ddp2-$r.json") ;;
    4) cmds=("${numesh_cmd[@]}" --dtype bf16 --log "$tmp/numesh-bf16-$r.csv") ;;
    5) cmds=("${numesh_cmd[@]}" --policy core --dims -1,1,1 --log "$tmp/numesh-2devices-$r.csv") ;;
    6) cmds=("${mpirun_cmd[@]}" "${numesh_cmd[@]}" --dims -1,1,1 --log "$tmp/numesh-2ranks-$r.csv") ;;
  esac
}
gemm_cmd=(env OPENBLAS_NUM_THREADS=2 "$PYTHON" "$torch_bench" --config "$model/config.json" --batch "$batch"
          --tokens "$tokens" --threads 1 --steps 0 --gemm-ceiling --gemm-repeats 50 --json "$tmp/gemm.json")

step "model: $layers layers, hidden $hidden, heads $heads/$kv_heads x $head_dim, intermediate $intermediate," \
     "vocabulary $vocab; batch $batch x $tokens tokens, $steps steps ($WARMUP warm-up), $rounds rounds"
for (( r = 1; r <= rounds; r++ )); do
  for i in "${configs[@]}"; do
    config_cmd "$i" "$r"
    step "round $r/$rounds: ${labels[$i]}"
    run_logged "${names[$i]}-$r" "${cmds[@]}"
    if (( i == 0 || i >= 4 )); then
      grep -E '^(numesh train:|compute|speed|time)' "$tmp/${names[$i]}-$r.out" || true
    else
      grep -E '^(median step|tokens/s|model FLOP/s)' "$tmp/${names[$i]}-$r.out"
    fi
  done
done
step "GEMM ceiling (OPENBLAS_NUM_THREADS=2, set_num_threads(1))"
run_logged gemm "${gemm_cmd[@]}"
grep '^GEMM ceiling' "$tmp/gemm.out"

# The exact commands, for the listing below the table (the temporary folder is gone by then).
commands="$tmp/commands.txt"
{
  for i in "${configs[@]}"; do
    config_cmd "$i" '<round>'
    [[ "${cmds[0]}" == env ]] && cmds=("${cmds[@]:1}")
    while [[ "${cmds[0]}" == OMPI_*=* ]]; do cmds=("${cmds[@]:1}"); done
    printf '%q ' "${cmds[@]}" | sed 's/ $//; s/\\<round\\>/<round>/g'
    echo
  done
  printf '%q ' "${gemm_cmd[@]:1}" | sed 's/ $//'
  echo
} >"$commands"

step "results"
"$PYTHON" - "$tmp" "$rounds" "$WARMUP" "$batch" "$tokens" "$commands" "$NUMESH_ROOT" "${#configs[@]}" "${labels[@]}" <<'EOF'
import csv
import json
import os
import re
import statistics
import sys

tmp, rounds, warmup, batch, tokens, commands_file, root, configs = sys.argv[1:9]
labels = sys.argv[9:9 + int(configs)]
rounds, warmup, tokens_per_step = int(rounds), int(warmup), int(batch) * int(tokens)
names = ["torch-best", "torch-threads2", "torch-ddp2"]


def numesh_round(name, r):
    """The median tokens/s of the steps after the warm-up in round r's CSV log."""
    path = os.path.join(tmp, f"{name}-{r}.csv")
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if not rows or "tokens_per_second" not in rows[0]:
        sys.exit(f"error: {path} has no tokens_per_second column")
    timed = [float(row["tokens_per_second"]) for row in rows][warmup:]
    if not timed:
        sys.exit(f"error: {path} holds {len(rows)} steps, none after the {warmup} warm-up")
    return statistics.median(timed)


def torch_round(name, r):
    with open(os.path.join(tmp, f"{name}-{r}.json")) as f:
        return json.load(f)


first = torch_round("torch-best", 1)
params = first["parameters"]
without_embedding = first["parameters_without_embedding"]
with open(os.path.join(tmp, "gemm.json")) as f:
    gemm = json.load(f)["gemm"]
ceiling = gemm["gflops"]

per_round = [[numesh_round("numesh", r) for r in range(1, rounds + 1)]]
per_round += [[torch_round(n, r)["tokens_per_second"] for r in range(1, rounds + 1)] for n in names]
per_round += [[numesh_round(n, r) for r in range(1, rounds + 1)]
              for n in ["numesh-bf16", "numesh-2devices", "numesh-2ranks"][:len(labels) - 4]]
medians = [statistics.median(v) for v in per_round]
BF16 = 4

# numesh's own parameter count, from its first output line, as a check of the model's identity.
numesh_params = None
with open(os.path.join(tmp, "numesh-1.out")) as f:
    found = re.search(r"([0-9.]+) M parameters", f.read())
    if found:
        numesh_params = float(found.group(1)) * 1e6

print()
with open(first["config"]) as f:
    c = json.load(f)
print(f"Model: Llama, {c['num_hidden_layers']} layers, hidden {c['hidden_size']}, heads "
      f"{c['num_attention_heads']}/{c['num_key_value_heads']} x {c['head_dim']}, intermediate "
      f"{c['intermediate_size']}, vocabulary {c['vocab_size']}, untied; {params} parameters ({params / 1e6:.2f} M, the embedding "
      f"table counted; {without_embedding / 1e6:.2f} M without it), batch {batch} x {tokens} tokens, "
      f"fp32 (bf16 compute in the --dtype bf16 row), AdamW with clipping. Each round's figure is the median step after the first {warmup}; "
      f"the table gives the median over {rounds} round(s). Model FLOP/s = 6 x parameters x tokens/s; "
      f"GEMM ceiling: torch.mm [{gemm['m']}, {gemm['k']}] x [{gemm['k']}, {gemm['n']}] fp32, "
      f"OPENBLAS_NUM_THREADS=2, set_num_threads(1): {ceiling:.1f} GFLOP/s.")
if numesh_params is not None and abs(numesh_params - params) > 0.006e6:
    print(f"\nwarning: numesh reports {numesh_params / 1e6:.2f} M parameters, PyTorch counts "
          f"{params / 1e6:.2f} M")
print()
print("| configuration | tokens/s | ms/step | numesh f32 / this | numesh bf16 / this | model GFLOP/s | of fp32 GEMM ceiling | rounds (tokens/s) |")
print("|---|---:|---:|---:|---:|---:|---:|---|")
for label, median, rounds_figures in zip(labels, medians, per_round):
    gflops = 6.0 * params * median / 1e9
    print(f"| {label} | {median:.0f} | {tokens_per_step / median * 1e3:.1f} | {medians[0] / median:.2f} "
          f"| {medians[BF16] / median:.2f} | {gflops:.1f} | {gflops / ceiling:.1%} "
          f"| {', '.join(f'{x:.0f}' for x in rounds_figures)} |")
if len(medians) > 6:
    print()
    print(f"numesh as 2 ranks: {medians[6] / medians[3]:.2f}x PyTorch DDP over gloo (2 ranks), "
          f"{medians[6] / medians[5]:.2f}x one numesh process of 2 devices on the same mesh.")
print()
print("Commands, from the source folder, one per configuration and then the GEMM ceiling's; DIR is "
      "the temporary folder scripts/bench_train.sh writes config.json and data.npy into and removes "
      "at the end, <round> the round's number:")
print()
print("```sh")
with open(commands_file) as f:
    print(f.read().rstrip("\n").replace(tmp, "$DIR").replace(root + "/", ""))
print("```")
EOF
