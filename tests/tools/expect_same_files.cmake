# Runs two commands that must succeed and checks that they gave the same: the files they write
# (FILE by the first, FILE2 by the second; several separated by '|', compared pairwise) hold the
# same bytes, or, with LINES instead, the lines of their output that match LINES are the same.
# A run across processes against one process.
#   cmake -DEXE=path -DARGS="a|b" -DEXE2=path -DARGS2="c|d"
#         (-DFILE=out1 -DFILE2=out2 | -DLINES=regex) -P expect_same_files.cmake
# ARGS are separated by '|' (a ';' would be split by add_test).
foreach(run "" 2)
  string(REPLACE "|" ";" files${run} "${FILE${run}}")
  foreach(f IN LISTS files${run})
    file(REMOVE "${f}")
  endforeach()
  string(REPLACE "|" ";" args "${ARGS${run}}")
  execute_process(COMMAND "${EXE${run}}" ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${EXE${run}} ${ARGS${run}}: exit status ${rc}\noutput:\n${out}")
  endif()
  if(DEFINED LINES)
    string(REGEX MATCHALL "${LINES}" lines${run} "${out}")
    if(NOT lines${run})
      message(FATAL_ERROR "${EXE${run}} ${ARGS${run}}: no line matches '${LINES}'\noutput:\n${out}")
    endif()
  endif()
  foreach(f IN LISTS files${run})
    if(NOT EXISTS "${f}")
      message(FATAL_ERROR "${EXE${run}} ${ARGS${run}} wrote no ${f}\noutput:\n${out}")
    endif()
  endforeach()
endforeach()
if(DEFINED LINES AND NOT lines STREQUAL lines2)
  message(FATAL_ERROR "the outputs differ:\n${lines}\nagainst\n${lines2}")
endif()
foreach(f IN ZIP_LISTS files files2)
  execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files "${f_0}" "${f_1}" RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${f_0} and ${f_1} differ")
  endif()
endforeach()
