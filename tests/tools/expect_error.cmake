# Runs a command and checks that it fails the way `numesh` must fail on bad input: exit status 2
# and exactly one stderr line `numesh: error: ...` matching EXPECT (after any `numesh: warning:`
# lines, which the runtime prints once for bindings the machine cannot do).
#   cmake -DEXE=path -DARGS="a|b|c" -DEXPECT=regex [-DEXPECT_STDOUT=regex] -P expect_error.cmake
# With EXPECT_STDOUT, stdout must match it too (what the command said before it failed).
# ARGS are separated by '|' (a ';' would be split by add_test).
string(REPLACE "|" ";" args "${ARGS}")
execute_process(COMMAND "${EXE}" ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
if(NOT rc EQUAL 2)
  message(FATAL_ERROR "expected exit status 2, got ${rc}\nstdout: ${out}\nstderr: ${err}")
endif()
if(NOT err MATCHES "^(numesh: warning: [^\n]*\n)*numesh: error: [^\n]*\n$")
  message(FATAL_ERROR "expected one line 'numesh: error: ...' on stderr, got:\n${err}")
endif()
if(NOT err MATCHES "${EXPECT}")
  message(FATAL_ERROR "stderr does not match '${EXPECT}':\n${err}")
endif()
if(DEFINED EXPECT_STDOUT AND NOT out MATCHES "${EXPECT_STDOUT}")
  message(FATAL_ERROR "stdout does not match '${EXPECT_STDOUT}':\n${out}")
endif()
