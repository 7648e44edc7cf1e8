# Runs the safetensors cross-check: safetensors_check.py writes a sharded checkpoint of PyTorch
# tensors (laid out as the official writer and transformers lay it out) and the reads to make,
# safetensors_check_main makes them with numesh, and the script compares them with PyTorch.
#   cmake -DMAIN=exe -DSCRIPT=safetensors_check.py -DDIR=work-dir [-DPYTHON=interpreter] -P safetensors_check.cmake
#
# The dependency rule is ops/torch_check.cmake's: a missing interpreter, torch or numpy FAILS
# the test, unless NUMESH_SKIP_TORCH_CHECKS=1, which makes the script print a line starting
# "torch_check: skipped:" (exit status 77) that the test's SKIP_REGULAR_EXPRESSION turns into a
# skip.
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
  message(FATAL_ERROR "safetensors_check: FAILED: ${PYTHON} is missing. Install Debian's python3, "
                      "python3-torch and python3-numpy (apt-get install python3 python3-torch "
                      "python3-numpy), or set NUMESH_SKIP_TORCH_CHECKS=1 to report this check as "
                      "skipped.")
endif()

file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}")
execute_process(COMMAND "${PYTHON}" "${SCRIPT}" write "${DIR}" RESULT_VARIABLE rc)
if(rc EQUAL 77 AND skip_missing)
  return()  # the script printed "torch_check: skipped: ..." naming the module
elseif(NOT rc EQUAL 0)
  message(FATAL_ERROR "safetensors_check.py write failed with status ${rc}")
endif()
execute_process(COMMAND "${MAIN}" "${DIR}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "safetensors_check_main failed with status ${rc}")
endif()
execute_process(COMMAND "${PYTHON}" "${SCRIPT}" check "${DIR}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "safetensors_check.py check failed with status ${rc}")
endif()
