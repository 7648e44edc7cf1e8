# Runs torch_check_main (numesh writes inputs and reference outputs) then torch_check.py
# (PyTorch recomputes and compares). When PyTorch is missing the script prints
# "torch_check: skipped: ..." and exits 77; CTest's SKIP_REGULAR_EXPRESSION turns that line
# into a skipped test (CMake 3.25 has no way to set -P's exit status).
#   cmake -DMAIN=exe -DSCRIPT=torch_check.py -DDIR=work-dir -P torch_check.cmake
file(REMOVE_RECURSE "${DIR}")
execute_process(COMMAND "${MAIN}" "${DIR}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "torch_check_main failed with status ${rc}")
endif()
if(NOT EXISTS /usr/bin/python3)
  message("torch_check: skipped: /usr/bin/python3 is missing")
  return()
endif()
execute_process(COMMAND /usr/bin/python3 "${SCRIPT}" "${DIR}" RESULT_VARIABLE rc)
if(rc EQUAL 77)
  return()
elseif(NOT rc EQUAL 0)
  message(FATAL_ERROR "torch_check.py failed with status ${rc}")
endif()
