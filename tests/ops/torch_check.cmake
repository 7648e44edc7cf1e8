# Runs torch_check_main (numesh writes seeded inputs, its outputs and cases.json) then
# torch_check.py (PyTorch recomputes every case in float64 and compares).
#   cmake -DMAIN=exe -DSCRIPT=torch_check.py -DDIR=work-dir [-DPYTHON=interpreter] -P torch_check.cmake
#
# A missing interpreter (PYTHON, default Debian's /usr/bin/python3), torch or numpy FAILS the
# test, naming the Debian package: a check that silently stops running is worse than one that
# fails. With NUMESH_SKIP_TORCH_CHECKS=1 in the environment those cases instead print a line
# starting "torch_check: skipped:" (the script exits 77 for a missing module), which the test's
# SKIP_REGULAR_EXPRESSION turns into a skip (CMake 3.25 has no way to set -P's exit status to
# a skip code). The variable changes nothing when the dependencies are there.
if(NOT DEFINED PYTHON)
  set(PYTHON /usr/bin/python3)
endif()
set(skip_missing OFF)
if("$ENV{NUMESH_SKIP_TORCH_CHECKS}" STREQUAL "1")
  set(skip_missing ON)
endif()

if(NOT EXISTS "${PYTHON}")
  if(skip_missing)
    message("torch_check: skipped: ${PYTHON} is missing (NUMESH_SKIP_TORCH_CHECKS=1)")
    return()
  endif()
  message(FATAL_ERROR "torch_check: FAILED: ${PYTHON} is missing. Install Debian's python3, "
                      "python3-torch and python3-numpy (apt-get install python3 python3-torch "
                      "python3-numpy), or set NUMESH_SKIP_TORCH_CHECKS=1 to report this check as "
                      "skipped.")
endif()

file(REMOVE_RECURSE "${DIR}")
execute_process(COMMAND "${MAIN}" "${DIR}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "torch_check_main failed with status ${rc}")
endif()
execute_process(COMMAND "${PYTHON}" "${SCRIPT}" "${DIR}" RESULT_VARIABLE rc)
if(rc EQUAL 77 AND skip_missing)
  return()  # the script printed "torch_check: skipped: ..." naming the module
elseif(NOT rc EQUAL 0)
  message(FATAL_ERROR "torch_check.py failed with status ${rc}")
endif()
