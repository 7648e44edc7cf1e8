# Runs a check of numesh against PyTorch: MAIN (a numesh program) and SCRIPT (its Python twin)
# in one work directory.
#   cmake -DMAIN=exe -DSCRIPT=script.py -DDIR=work-dir [-DPYTHON=interpreter] [-DPYTHON_FIRST=ON]
#         -P torch_check.cmake
# By default MAIN writes (numesh's inputs, outputs and a manifest: torch_check_main) and then
# `SCRIPT DIR` recomputes and compares (torch_check.py, dtype_check.py). With PYTHON_FIRST
# the script writes first (`SCRIPT write DIR`: safetensors_check.py's PyTorch checkpoint), MAIN
# reads, and `SCRIPT check DIR` compares.
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

get_filename_component(main_name "${MAIN}" NAME)
get_filename_component(script_name "${SCRIPT}" NAME)
# Runs the script with `args`; a 77 under NUMESH_SKIP_TORCH_CHECKS=1 ends the check as skipped.
macro(run_script)
  execute_process(COMMAND "${PYTHON}" "${SCRIPT}" ${ARGN} RESULT_VARIABLE rc)
  if(rc EQUAL 77 AND skip_missing)
    return()  # the script printed "torch_check: skipped: ..." naming the module
  elseif(NOT rc EQUAL 0)
    string(JOIN " " script_args ${ARGN})
    message(FATAL_ERROR "${script_name} ${script_args} failed with status ${rc}")
  endif()
endmacro()

file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}")
if(PYTHON_FIRST)
  run_script(write "${DIR}")
endif()
execute_process(COMMAND "${MAIN}" "${DIR}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${main_name} failed with status ${rc}")
endif()
if(PYTHON_FIRST)
  run_script(check "${DIR}")
else()
  run_script("${DIR}")
endif()
