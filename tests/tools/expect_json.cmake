# Runs a command that must succeed and write a JSON file, then checks the file: it must parse
# (string(JSON)) and match EXPECT.
#   cmake -DEXE=path -DARGS="a|b|c" -DFILE=out.json -DEXPECT=regex -P expect_json.cmake
# ARGS are separated by '|' (a ';' would be split by add_test).
string(REPLACE "|" ";" args "${ARGS}")
file(REMOVE "${FILE}")
execute_process(COMMAND "${EXE}" ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "expected exit status 0, got ${rc}\nstdout: ${out}\nstderr: ${err}")
endif()
if(NOT EXISTS "${FILE}")
  message(FATAL_ERROR "${FILE} was not written\nstdout: ${out}")
endif()
file(READ "${FILE}" json)
string(JSON type ERROR_VARIABLE json_error TYPE "${json}")
if(json_error OR NOT type STREQUAL "OBJECT")
  message(FATAL_ERROR "${FILE} is not a JSON object (${json_error}):\n${json}")
endif()
if(NOT json MATCHES "${EXPECT}")
  message(FATAL_ERROR "${FILE} does not match '${EXPECT}':\n${json}")
endif()
