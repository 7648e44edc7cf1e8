# Checks that a training run stopped, saved and resumed logged the same steps as one straight
# run: numesh train's CSV logs (step,loss,lr,grad_norm,tokens_per_second,seconds), compared
# line by line on step, loss, lr and grad_norm (printed to 9 significant digits), the timing
# columns left out. Both must hold STEPS steps.
#   cmake -DRESUMED=log.csv -DSTRAIGHT=log.csv -DSTEPS=n -P compare_train_logs.cmake
function(logged_steps file out)
  if(NOT EXISTS "${file}")
    message(FATAL_ERROR "compare_train_logs: no log ${file}")
  endif()
  file(STRINGS "${file}" lines)
  list(POP_FRONT lines header)
  if(NOT header STREQUAL "step,loss,lr,grad_norm,tokens_per_second,seconds")
    message(FATAL_ERROR "compare_train_logs: ${file} starts with '${header}', not numesh train's header")
  endif()
  set(kept "")
  foreach(line IN LISTS lines)
    string(REGEX MATCH "^[^,]*,[^,]*,[^,]*,[^,]*" columns "${line}")
    list(APPEND kept "${columns}")
  endforeach()
  set(${out} "${kept}" PARENT_SCOPE)
endfunction()

logged_steps("${RESUMED}" resumed)
logged_steps("${STRAIGHT}" straight)
list(LENGTH resumed n_resumed)
list(LENGTH straight n_straight)
if(NOT n_resumed EQUAL STEPS OR NOT n_straight EQUAL STEPS)
  message(FATAL_ERROR "compare_train_logs: expected ${STEPS} steps in each log; the resumed run "
                      "logged ${n_resumed}, the straight one ${n_straight}")
endif()
foreach(i RANGE 1 ${STEPS})
  math(EXPR at "${i} - 1")
  list(GET resumed ${at} r)
  list(GET straight ${at} s)
  if(NOT r STREQUAL s)
    message(FATAL_ERROR "compare_train_logs: step ${i} differs (step,loss,lr,grad_norm):\n"
                        "  resumed  ${r}\n  straight ${s}")
  endif()
  string(REGEX MATCH "^[0-9]+" step "${r}")
  if(NOT step EQUAL i)
    message(FATAL_ERROR "compare_train_logs: line ${i} of the logs is step '${step}'")
  endif()
endforeach()
message("compare_train_logs: ${STEPS} steps, resumed and straight alike")
