# Runs a command that must succeed (exit status STATUS, 0 unless given) and checks that its
# output (stdout and stderr together) matches EXPECT. CTest's PASS_REGULAR_EXPRESSION alone
# ignores the exit status, so a run whose check failed could still pass on its output.
#   cmake -DEXE=path -DARGS="a|b|c" -DEXPECT=regex [-DSTATUS=n] -P expect_output.cmake
# ARGS are separated by '|' (a ';' would be split by add_test).
if(NOT DEFINED STATUS)
  set(STATUS 0)
endif()
string(REPLACE "|" ";" args "${ARGS}")
execute_process(COMMAND "${EXE}" ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL STATUS)
  message(FATAL_ERROR "expected exit status ${STATUS}, got ${rc}\noutput:\n${out}")
endif()
if(NOT out MATCHES "${EXPECT}")
  message(FATAL_ERROR "the output does not match '${EXPECT}':\n${out}")
endif()
