# Checks scripts/plot_benchmarks.py.
#
#   cmake -DMODE=plot -DSCRIPT=plot_benchmarks.py -DOUT=dir -DINPUTS="a.json|b.json"
#         -DEXPECT="a_matrix.png|b_sizes.png" [-DPYTHON=interpreter] -P plot_check.cmake
#     runs the script on INPUTS (the JSON files the bench tests wrote) with --out OUT and checks
#     that every file of EXPECT exists in OUT and is not empty;
#   cmake -DMODE=reject -DSCRIPT=plot_benchmarks.py -DOUT=dir [-DPYTHON=...] -P plot_check.cmake
#     writes files that are not bench JSON files into OUT and checks that the script refuses
#     each with exit status 2 and a message naming the file and what is wrong (this needs no
#     matplotlib: the script reads its inputs before importing it).
#
# A missing interpreter (PYTHON, default Debian's /usr/bin/python3) or matplotlib FAILS the
# plot test, naming the Debian package: a check that silently stops running is worse than one
# that fails. With NUMESH_SKIP_PLOT_CHECKS=1 in the environment it instead prints a line
# starting "plot_check: skipped:", which the test's SKIP_REGULAR_EXPRESSION turns into a skip
# (as tests/ops/torch_check.cmake does for PyTorch). The variable changes nothing when the
# dependencies are there.
if(NOT DEFINED PYTHON)
  set(PYTHON /usr/bin/python3)
endif()
set(skip_missing OFF)
if("$ENV{NUMESH_SKIP_PLOT_CHECKS}" STREQUAL "1")
  set(skip_missing ON)
endif()

function(missing what)
  if(skip_missing)
    message("plot_check: skipped: ${what} (NUMESH_SKIP_PLOT_CHECKS=1; Debian package python3-matplotlib)")
    return()
  endif()
  message(FATAL_ERROR "plot_check: FAILED: ${what}. Install Debian's python3 and python3-matplotlib "
                      "(apt-get install python3 python3-matplotlib), or set "
                      "NUMESH_SKIP_PLOT_CHECKS=1 to report this check as skipped.")
endfunction()

if(NOT EXISTS "${PYTHON}")
  missing("${PYTHON} is missing")
  return()
endif()
file(MAKE_DIRECTORY "${OUT}")

if(MODE STREQUAL "reject")
  file(WRITE "${OUT}/not_json.json" "numesh\n")
  file(WRITE "${OUT}/no_kind.json" "{\"check\": {\"ok\": true}}\n")
  file(WRITE "${OUT}/no_models.json" "{\"kind\": \"numesh bench decode\", \"read\": {\"gbps\": 1.0}}\n")
  file(WRITE "${OUT}/bad_matrix.json"
       "{\"kind\": \"numesh bench memory\", \"bandwidth\": {\"devices\": [], \"measurements\": []}, "
       "\"matrix\": {\"devices\": [{}], \"nodes\": [{}], \"read_gbps\": [[1.0, 2.0]], \"latency_ns\": [[1.0]]}}\n")
  set(cases
      "not_json.json" "not_json\\.json: not JSON \\(line 1, column 1: "
      "no_kind.json" "no_kind\\.json: not a numesh bench memory or bench decode JSON file \\(it has no \"kind\" field"
      "no_models.json" "no_models\\.json: not a complete 'numesh bench decode' file: \"models\" is missing or empty"
      "bad_matrix.json" "bad_matrix\\.json: not a complete 'numesh bench memory' file: \"matrix\\.read_gbps\" is not 1 rows of 1 values"
      "missing.json" "missing\\.json: cannot read it \\(No such file or directory\\)")
  while(cases)
    list(POP_FRONT cases file expect)
    execute_process(COMMAND "${PYTHON}" "${SCRIPT}" "${OUT}/${file}" --out "${OUT}"
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 2)
      message(FATAL_ERROR "${file}: expected exit status 2, got ${rc}\nstdout: ${out}\nstderr: ${err}")
    endif()
    if(NOT err MATCHES "^plot_benchmarks\\.py: error: [^\n]*${expect}[^\n]*\n$")
      message(FATAL_ERROR "${file}: expected one line 'plot_benchmarks.py: error: ...' matching "
                          "'${expect}', got:\n${err}")
    endif()
  endwhile()
  return()
endif()

execute_process(COMMAND "${PYTHON}" -c "import matplotlib" RESULT_VARIABLE rc ERROR_VARIABLE err
                ERROR_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  string(REGEX REPLACE ".*\n" "" err "${err}")  # the exception line, not the traceback
  missing("the Python module matplotlib is missing for ${PYTHON} (${err})")
  return()
endif()

string(REPLACE "|" ";" inputs "${INPUTS}")
string(REPLACE "|" ";" expected "${EXPECT}")
foreach(png ${expected})
  file(REMOVE "${OUT}/${png}")
endforeach()
execute_process(COMMAND "${PYTHON}" "${SCRIPT}" ${inputs} --out "${OUT}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  get_filename_component(script_name "${SCRIPT}" NAME)
  message(FATAL_ERROR "${script_name} exited with ${rc}\nstdout: ${out}\nstderr: ${err}")
endif()
foreach(png ${expected})
  if(NOT EXISTS "${OUT}/${png}")
    message(FATAL_ERROR "${OUT}/${png} was not written\nstdout: ${out}\nstderr: ${err}")
  endif()
  file(SIZE "${OUT}/${png}" size)
  if(size EQUAL 0)
    message(FATAL_ERROR "${OUT}/${png} is empty")
  endif()
  # A PNG starts with its 8-byte signature: \x89 P N G \r \n \x1a \n.
  file(READ "${OUT}/${png}" signature LIMIT 8 HEX)
  if(NOT signature STREQUAL "89504e470d0a1a0a")
    message(FATAL_ERROR "${OUT}/${png} is not a PNG file (it starts with ${signature})")
  endif()
  message("plot_check: ${png}: ${size} bytes")
endforeach()
