#!/bin/bash
# Two numesh programs alternated on one `numesh generate` run, for A/B figures on a noisy
# machine (docs/benchmarks.md reads the ratio of each round, and the median of the ratios):
#   bench/ab_generate.sh BIN_A BIN_B ROUNDS METRIC -- GENERATE_ARGS...
# METRIC is a key of generate's --json (prefill_tokens_per_second, decode_tokens_per_second).
# Prints each program's figures and median, and the ratios B / A per round with their median.
set -euo pipefail
usage="usage: bench/ab_generate.sh BIN_A BIN_B ROUNDS METRIC -- GENERATE_ARGS..."
a=${1:?$usage}
b=${2:?$usage}
rounds=${3:?$usage}
metric=${4:?$usage}
shift 4
[ "${1:-}" == "--" ] && shift
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for r in $(seq "$rounds"); do
  for side in A B; do
    bin=$a
    [ $side == B ] && bin=$b
    "$bin" generate "$@" --quiet --json "$out/$side.json" > /dev/null
    python3 -c "import json, sys; print(sys.argv[1], json.load(open(sys.argv[2]))[sys.argv[3]])" \
        "$side" "$out/$side.json" "$metric"
  done
done | python3 -c "
import statistics as st, sys
v = {'A': [], 'B': []}
for line in sys.stdin:
    k, x = line.split()
    v[k].append(float(x))
def g(x):
    return float(f'{x:.4g}')
for k in 'AB':
    print(k, [g(x) for x in v[k]], 'median', g(st.median(v[k])))
r = [b / a for a, b in zip(v['A'], v['B'])]
print('B / A per round', [round(x, 2) for x in r], 'median', round(st.median(r), 3))"
