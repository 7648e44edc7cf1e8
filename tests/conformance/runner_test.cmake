# Tests of eformer_conformance itself: runs it on the tiny fixtures in tests/data/conformance
# (real cases copied from tests/data/eformer into files of the same names, so the same
# evaluators apply) with fixture lists of divergences, and checks the exit status and the
# lines that name each problem.
#   cmake -DRUNNER=eformer_conformance -DDATA=tests/data/conformance -P runner_test.cmake

# check(NAME STATUS COMPAT PATHS... [EXPECT text...] [ABSENT text...]): runs the runner with
# --compat COMPAT on PATHS; fails unless it exits with STATUS, its output (stdout and stderr)
# contains every EXPECT text and none of the ABSENT texts (plain substrings, not regexes).
function(check name status compat)
  cmake_parse_arguments(PARSE_ARGV 3 arg "" "" "PATHS;EXPECT;ABSENT")
  execute_process(COMMAND "${RUNNER}" --compat "${compat}" ${arg_PATHS}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(output "${out}${err}")
  set(problems "")
  if(NOT rc STREQUAL status)
    string(APPEND problems "\n  exit status ${rc}, expected ${status}")
  endif()
  foreach(text IN LISTS arg_EXPECT)
    string(FIND "${output}" "${text}" at)
    if(at EQUAL -1)
      string(APPEND problems "\n  missing: ${text}")
    endif()
  endforeach()
  foreach(text IN LISTS arg_ABSENT)
    string(FIND "${output}" "${text}" at)
    if(NOT at EQUAL -1)
      string(APPEND problems "\n  unexpected: ${text}")
    endif()
  endforeach()
  if(problems)
    # SEND_ERROR, not FATAL_ERROR: every check runs, and the script's status is non-zero.
    message(SEND_ERROR "runner test '${name}' failed:${problems}\n--- output ---\n${output}")
  else()
    message(STATUS "ok: ${name}")
  endif()
endfunction()

set(vectors "${DATA}/vectors")

check("a correct documented divergence passes" 0 "${DATA}/documented.md"
  PATHS "${vectors}"
  EXPECT
    "DOCUMENTED mesh_defaults: numesh returns what documented.md line 13 states, eformer's value but at /LOG_SHARDING_MOVE"
    "DOCUMENTED auto_partition_spec/not_an_array: not evaluated (a non-array argument does not type-check in C++)"
    "DOCUMENTED vrn_auto_partition_spec/dp1_fsdp8/names_as_tuple: numesh returns what"
    "summary: 4 cases in 2 files: OK"
    "  1 passed\n"
    "  3 documented divergences, each returning the value documented.md states (1 not evaluated, as stated)"
    "  0 documented divergences whose value differs from documented.md"
    "  0 failed undocumented"
    "  0 stale entries in documented.md"
    "  0 count mismatches"
  ABSENT "not_an_item" "in-a-code-block" "stale:")

check("a documented value numesh does not return fails" 1 "${DATA}/wrong_values.md"
  PATHS "${vectors}"
  EXPECT
    "VALUE MISMATCH mesh_defaults (wrong_values.md line 5): numesh's value is not the documented one"
    "    documented: {\"DEFAULT_MASK_VALUE\":-2.381976426469702e+38,\"DEFAULT_NAMED_SHARDING_STG\":[\"dp\",\"fsdp\",\"ep\",\"tp\",\"sp\"],\"DEFAULT_SHARDING_STG\":[1,-1,1,1,1],\"MIN_SHARDING_SIZE\":4096}"
    "    actual:     {\"DEFAULT_MASK_VALUE\":-2.381976426469702e+38,\"DEFAULT_NAMED_SHARDING_STG\":[\"dp\",\"fsdp\",\"ep\",\"tp\",\"sp\"],\"DEFAULT_SHARDING_STG\":[1,-1,1,1,1],\"MIN_SHARDING_SIZE\":16384}"
    "VALUE MISMATCH auto_partition_spec/not_an_array (wrong_values.md line 7): documented with a value, but the runner does not evaluate it"
    "VALUE MISMATCH vrn_auto_partition_spec/dp1_fsdp8/names_as_tuple (wrong_values.md line 9): documented as not evaluated, but the runner evaluates it"
    "summary: 4 cases in 2 files: FAILED"
    "  0 documented divergences, each returning"
    "  3 documented divergences whose value differs from wrong_values.md")

check("eformer's fields must be eformer's values" 1 "${DATA}/wrong_eformer_fields.md"
  PATHS "${vectors}"
  EXPECT
    "VALUE MISMATCH mesh_defaults (wrong_eformer_fields.md line 5): numesh agrees with eformer at /MIN_SHARDING_SIZE, which the item lists as differing"
    "VALUE MISMATCH vrn_auto_partition_spec/dp1_fsdp8/names_as_tuple (wrong_eformer_fields.md line 8): numesh differs from eformer outside /error"
    "    eformer elsewhere: {}"
    "    numesh elsewhere:  {\"spec\":[\"tp\",\"fsdp\"]}"
    "  1 documented divergences, each returning"
    "  2 documented divergences whose value differs from wrong_eformer_fields.md")

check("stale items fail" 1 "${DATA}/stale.md"
  PATHS "${vectors}"
  EXPECT
    "stale: `constants.json:mode_constants` (stale.md line 10): the case now matches eformer"
    "stale: `constants.json:no_such_case` (stale.md line 12): names no case: constants.json has no case with this id"
    "stale: `misc.json:get_axes_size_in_mesh/fsdp` (stale.md line 14): names no case: no vector file misc.json was run"
    "stale: `auto_partition_spec.json:vrn_auto_partition_spec/dp1_fsdp8/names_as_tuple` (stale.md line 16): states no numesh result"
    "FAIL vrn_auto_partition_spec/dp1_fsdp8/names_as_tuple (listed on stale.md line 16 without numesh's result)"
    "  1 failed undocumented"
    "  4 stale entries in stale.md")

# Given a single file, only that file's items can be stale.
check("staleness is checked only for the files run" 1 "${DATA}/stale.md"
  PATHS "${vectors}/constants.json"
  EXPECT
    "stale: `constants.json:mode_constants`"
    "stale: `constants.json:no_such_case`"
    "summary: 2 cases in 1 file: FAILED"
    "  2 stale entries in stale.md"
  ABSENT "misc.json" "auto_partition_spec")

check("a wildcard is rejected" 2 "${DATA}/wildcard.md"
  PATHS "${vectors}"
  EXPECT "wildcard.md:5: `constants.json:mesh_*`: wildcards are not supported; list each case with the value numesh returns"
  ABSENT "summary:")

check("a count mismatch fails" 1 "${DATA}/documented.md"
  PATHS "${DATA}/bad_count/constants.json"
  EXPECT
    "count mismatch: constants.json: \"count\" is 3 but the file has 2 cases"
    "  1 documented divergences, each returning"
    "  0 stale entries in documented.md"
    "  1 count mismatches"
    "summary: 2 cases in 1 file: FAILED")

check("a case that cannot be written in C++ is documented by its kind" 0 "${DATA}/kinds.md"
  PATHS "${vectors}"
  EXPECT
    "DOCUMENTED auto_partition_spec/not_an_array: not evaluated (a non-array argument does not type-check in C++), a kind of call kinds.md line 7 lists"
    "summary: 4 cases in 2 files: OK"
    "  3 documented divergences, each returning the value kinds.md states (1 not evaluated, as stated)"
    "  1 of them documented by kind"
    "  0 failed undocumented"
    "  0 stale entries in kinds.md")

check("a kind must be the runner's reason, and a kind no case needs is stale" 1 "${DATA}/kinds_wrong.md"
  PATHS "${vectors}"
  EXPECT
    "NOT EVALUATED auto_partition_spec/not_an_array: a non-array argument does not type-check in C++"
    "stale: the kind `a non-array argument does not compile` (kinds_wrong.md line 7)"
    "stale: the kind `no case is evaluated for this reason` (kinds_wrong.md line 8)"
    "  0 of them documented by kind"
    "  1 failed undocumented"
    "  2 stale entries in kinds_wrong.md")

# Given a single file, a kind may be needed by another file's cases.
check("kinds are not stale when only some files run" 0 "${DATA}/kinds.md"
  PATHS "${vectors}/constants.json"
  EXPECT "summary: 2 cases in 1 file: OK" "  0 stale entries in kinds.md")

check("a row that names no reason is rejected" 2 "${DATA}/kinds_malformed.md"
  PATHS "${vectors}"
  EXPECT "kinds_malformed.md:7: a row must start with the runner's reason in backticks"
  ABSENT "summary:")

check("an unreadable list is an error" 2 "${DATA}/no-such-list.md"
  PATHS "${vectors}"
  EXPECT "eformer_conformance: cannot read ${DATA}/no-such-list.md")
