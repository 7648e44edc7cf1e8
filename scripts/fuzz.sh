#!/usr/bin/env bash
# fuzz.sh: builds numesh's libFuzzer targets (fuzz/, the `sanitize` preset: clang, ASan, UBSan)
# and runs each for a given time, starting from its seed corpus fuzz/corpus/TARGET (which also
# holds the regression-* inputs of every failure found so far, run first, every time).
#
#   scripts/fuzz.sh [--time SECONDS] [--seed N] [--jobs N] [--no-build] [TARGET...]
#
#   --time SECONDS  how long each target fuzzes [60]
#   --seed N        libFuzzer's random seed: the same N explores the same inputs again
#                   [0: a new seed each run, printed, so that a finding can be repeated]
#   --jobs N        how many targets fuzz at once, each on one core [1]
#   --no-build      use the targets already built in the sanitize build folder
#   TARGET...       the targets to run [every fuzz/*_fuzz.cpp]
#
# The JSON parsers' targets and the spec parsers' targets mutate with a dictionary of their
# grammar's tokens and keys (fuzz/dictionaries/). Prints the seed, then a table (target, seeds,
# corpus at the end, runs, runs per second, findings) and exits
# 1 when any target found something: its input is then in
# <build>/sanitize/fuzz-findings/TARGET/ (crash-*, leak-*, timeout-*, oom-*), with the
# fuzzer's log beside it; reproduce with `<build>/sanitize/fuzz/TARGET FILE`, and keep the input
# as fuzz/corpus/TARGET/regression-NAME once fixed. The working corpus grows in
# <build>/sanitize/fuzz-corpus/TARGET and is reused by the next run; the seeds are not written.
# Environment: as scripts/common.sh (NUMESH_BUILD_DIR, NUMESH_JOBS, NUMESH_SKIP_SETUP).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

seconds=60
seed=0
jobs=1
build=1
targets=()
while (($#)); do
  case "$1" in
    --time) seconds="${2:?--time needs a number of seconds}"; shift 2 ;;
    --seed) seed="${2:?--seed needs a number}"; shift 2 ;;
    --jobs) jobs="${2:?--jobs needs a number}"; shift 2 ;;
    --no-build) build=0; shift ;;
    -h|--help) sed -n '2,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) targets+=("$1"); shift ;;
  esac
done
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || die "--time '$seconds': expected a positive whole number of seconds"
[[ "$seed" =~ ^[0-9]+$ ]] || die "--seed '$seed': expected a whole number (0: a new seed each run)"
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || die "--jobs '$jobs': expected a positive whole number"

if ((seed == 0)); then
  # 1 .. 2^30: libFuzzer's -seed=0 would pick one itself, but print it only in each log.
  seed=$(( ((RANDOM << 15) | RANDOM) + 1 ))
fi

all=()
for f in "$NUMESH_ROOT"/fuzz/*_fuzz.cpp; do all+=("$(basename "$f" .cpp)"); done

# dictionary_of TARGET: the libFuzzer dictionary TARGET mutates with, if any.
dictionary_of() {
  case "$1" in
    hf_config_fuzz|tokenizer_json_fuzz|partition_axis_fuzz|safetensors_fuzz|safetensors_index_fuzz)
      echo "$NUMESH_ROOT/fuzz/dictionaries/json.dict" ;;
    partition_spec_fuzz|cli_parsers_fuzz) echo "$NUMESH_ROOT/fuzz/dictionaries/partition_spec.dict" ;;
  esac
}
((${#targets[@]})) || targets=("${all[@]}")
for t in "${targets[@]}"; do
  [[ " ${all[*]} " == *" $t "* ]] || die "no fuzz target '$t' (there are: ${all[*]})"
done

dir="$(build_dir sanitize)"
if ((build)); then
  ensure_packages
  configure_and_build_targets() {
    step "configure preset 'sanitize' in $dir"
    cmake -S "$NUMESH_ROOT" --preset sanitize -B "$dir" >/dev/null
    step "build the fuzz targets (-j$NUMESH_JOBS)"
    cmake --build "$dir" -j "$NUMESH_JOBS" --target "${targets[@]}"
  }
  configure_and_build_targets
fi

# hwloc reports every malformed XML on stderr; the findings are what matters here.
export HWLOC_HIDE_ERRORS=2
# ASan's leak check runs after each input (libFuzzer's -detect_leaks) with the suppressions of
# scripts/sanitizers/lsan.supp (leaks inside other libraries, each explained); UBSan stops at
# the first report.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$NUMESH_ROOT/scripts/sanitizers/lsan.supp:print_suppressions=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

# fuzz_one TARGET: fuzzes TARGET for `seconds`; writes its table row to
# $dir/fuzz-findings/TARGET/row, and its log's tail to .../report when it found something.
fuzz_one() {
  local t="$1" seeds work findings log status=0 runs rate found dict_args=()
  seeds="$NUMESH_ROOT/fuzz/corpus/$t"
  [[ -z "$(dictionary_of "$t")" ]] || dict_args=(-dict="$(dictionary_of "$t")")
  work="$dir/fuzz-corpus/$t"
  findings="$dir/fuzz-findings/$t"
  log="$findings/fuzz.log"
  # -timeout: one input taking 10 s is a hang; -rss_limit_mb/-malloc_limit_mb: an allocation
  # that follows from a few bytes of input must not reach 2 GiB.
  "$dir/fuzz/$t" "$work" "$seeds" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -malloc_limit_mb=2048 -print_final_stats=1 -seed="$seed" "${dict_args[@]}" -artifact_prefix="$findings/" \
    >"$log" 2>&1 || status=$?
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)"
  found="$(find "$findings" -type f ! -name fuzz.log | wc -l)"
  if ((status != 0 || found > 0)); then
    tail -n 40 "$log" >"$findings/report"
  fi
  printf '%-24s %6s %8s %10s %9s %9s\n' "$t" "$(find "$seeds" -type f | wc -l)" \
    "$(find "$work" -type f | wc -l)" "${runs:-?}" "${rate:-?}" "$found" >"$findings/row"
}

step "fuzz seed $seed (scripts/fuzz.sh --seed $seed --time $seconds repeats this search)"
running=0
for t in "${targets[@]}"; do
  findings="$dir/fuzz-findings/$t"
  rm -rf "$findings"  # what an earlier run found was reported by it
  mkdir -p "$dir/fuzz-corpus/$t" "$findings"
  step "$t: ${seconds} s from $(find "$NUMESH_ROOT/fuzz/corpus/$t" -type f | wc -l) seeds"
  fuzz_one "$t" &
  running=$((running + 1))
  if ((running >= jobs)); then
    wait -n
    running=$((running - 1))
  fi
done
wait

rows=()
failed=()
for t in "${targets[@]}"; do
  findings="$dir/fuzz-findings/$t"
  if [[ -f "$findings/report" ]]; then
    failed+=("$t")
    step "$t found something; the end of its log:"
    cat "$findings/report"
    rm -f "$findings/report"
  fi
  rows+=("$(cat "$findings/row")")
  rm -f "$findings/row"
done

step "fuzzing summary (${seconds} s per target)"
printf '%-24s %6s %8s %10s %9s %9s\n' target seeds corpus runs "runs/s" findings
printf '%s\n' "${rows[@]}"
if ((${#failed[@]})); then
  die "findings in: ${failed[*]} with seed $seed (inputs and logs in $dir/fuzz-findings/)"
fi
echo "fuzz: ${#targets[@]} targets, no findings"
