# Runs the tokenizer check: the reference script (tokenizer_check/reference.mjs, Hugging Face's
# tokenizers.js under Node.js) writes the ids and texts of the corpus for each real
# tokenizer.json into DIR, then MAIN (tokenizer_check_main) compares numesh's against them.
#   cmake -DMAIN=exe -DSCRIPT=reference.mjs -DCORPUS=corpus.json -DDIR=work-dir
#         [-DNODE=node] -P tokenizer_check.cmake
#
# As ops/torch_check.cmake: a missing node or npm package FAILS the test, naming what to
# install; with NUMESH_SKIP_TOKENIZER_CHECKS=1 in the environment those cases instead print a
# line starting "tokenizer_check: skipped:" (the script exits 77 for a missing package), which
# the test's SKIP_REGULAR_EXPRESSION turns into a skip. The variable changes nothing when the
# dependencies are there.
if(NOT DEFINED NODE)
  find_program(NODE node)
endif()
set(skip_missing OFF)
if("$ENV{NUMESH_SKIP_TOKENIZER_CHECKS}" STREQUAL "1")
  set(skip_missing ON)
endif()

if(NOT NODE)
  if(skip_missing)
    message("tokenizer_check: skipped: node is missing (NUMESH_SKIP_TOKENIZER_CHECKS=1)")
    return()
  endif()
  message(FATAL_ERROR "tokenizer_check: FAILED: node is missing. Install Debian's nodejs "
                      "(apt-get install nodejs npm; scripts/setup.sh does), run `npm ci` in "
                      "tests/models/tokenizer_check (scripts/test.sh does), or set "
                      "NUMESH_SKIP_TOKENIZER_CHECKS=1 to report this check as skipped.")
endif()

file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}")
execute_process(COMMAND "${NODE}" "${SCRIPT}" "${CORPUS}" "${DIR}" RESULT_VARIABLE rc)
if(rc EQUAL 77 AND skip_missing)
  return()  # the script printed "tokenizer_check: skipped: ..." naming the package
elseif(NOT rc EQUAL 0)
  message(FATAL_ERROR "tokenizer_check: reference.mjs failed with status ${rc}")
endif()
execute_process(COMMAND "${MAIN}" "${DIR}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tokenizer_check: tokenizer_check_main failed with status ${rc}")
endif()
