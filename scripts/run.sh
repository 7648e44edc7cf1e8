#!/usr/bin/env bash
# run.sh: the main job. Installs missing packages, configures and builds the `release`
# preset, then runs numesh on this machine's own topology:
#   1. `numesh topology`: the machine, the devices (one per NUMA node), distances, notes;
#   2. `numesh run`: a small transformer (SwiGLU and MoE blocks) sharded over the devices as a
#      tensor-parallel mesh: prefill and decode steps, every output checked against the dense
#      model, the plan and the throughput;
#   3. `numesh generate`: a small Llama with random weights written in Hugging Face layout
#      (config.json + model.safetensors), loaded back through the path a real checkpoint takes
#      and decoded greedily over the mesh (NUMESH_MODEL=DIR generates from a real checkpoint
#      instead, NUMESH_PROMPT its prompt text);
#   4. `numesh bench collectives`: every collective at 64 KiB and 64 MiB per device against a
#      plain shared-memory loop and memcpy, results checked; then 64 KiB again as a chain of
#      64 collectives in one run (--chain 64), as a model's step meets them.
# On a machine with one NUMA node, steps 2-4 use one device per core (--policy core) so that
# there is something to move between devices; NUMESH_POLICY overrides the choice.
#
#   scripts/run.sh               run the job above
#   scripts/run.sh ARGS...       run `numesh ARGS...` instead (e.g. `scripts/run.sh --help`)
#
# Environment: see scripts/common.sh (NUMESH_BUILD_DIR, NUMESH_JOBS, NUMESH_SKIP_SETUP).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

ensure_packages
# The main job needs no tests; built for this machine's CPU (scripts/test.sh tests and installs
# the `portable` preset instead, which leaves -march=native out).
configure_and_build release "${NUMESH_RELEASE_FLAGS[@]}"

# The CLI belongs to tools/; find the program wherever tools/ puts it in the build tree.
dir="$(build_dir release)"
numesh_bin=""
if [[ -d "$dir/tools" ]]; then
  numesh_bin="$(find "$dir/tools" -type f -name numesh -perm -u+x -print -quit)"
fi
[[ -n "$numesh_bin" ]] || die "the numesh program was not built (no executable 'numesh' under
$dir/tools): the command-line tool has not landed yet, or NUMESH_BUILD_TOOLS is OFF"

if [[ $# -gt 0 ]]; then
  step "numesh $*"
  exec "$numesh_bin" "$@"
fi

nodes=$(find /sys/devices/system/node -maxdepth 1 -name 'node[0-9]*' 2>/dev/null | wc -l)
policy="${NUMESH_POLICY:-numa}"
if [[ -z "${NUMESH_POLICY:-}" && "$nodes" -le 1 ]]; then
  policy=core
  echo "note: this machine has one NUMA node; the mesh and the benchmark use one device per core"
fi
step "numesh topology"
"$numesh_bin" topology
step "numesh run --policy $policy"
"$numesh_bin" run --policy "$policy"
if [[ -n "${NUMESH_MODEL:-}" ]]; then
  step "numesh generate --policy $policy --model $NUMESH_MODEL"
  "$numesh_bin" generate --policy "$policy" --model "$NUMESH_MODEL" \
    --prompt "${NUMESH_PROMPT:-The capital of France is}" --max-new-tokens 32
else
  step "numesh generate --policy $policy (a random Llama in Hugging Face layout)"
  "$numesh_bin" generate --policy "$policy" --random-model "$dir/random-model" --ids 1,450,3996,310 \
    --max-new-tokens 32 --ignore-eos
fi
step "numesh bench collectives --policy $policy --sizes 64K,64M"
"$numesh_bin" bench collectives --policy "$policy" --sizes 64K,64M --min-time 0.2
step "numesh bench collectives --policy $policy --sizes 64K --chain 64"
"$numesh_bin" bench collectives --policy "$policy" --sizes 64K --chain 64 --min-time 0.2
