# numesh_add_test(name SOURCES... [LIBS ...] [LABELS ...]): one GoogleTest executable whose
# TESTs are each registered with CTest.
include(GoogleTest)
function(numesh_add_test name)
  cmake_parse_arguments(ARG "" "" "LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_UNPARSED_ARGUMENTS})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gmock GTest::gtest_main
                        $<BUILD_INTERFACE:numesh_warnings>)
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60
                       PROPERTIES TIMEOUT 120 LABELS "${ARG_LABELS}")
endfunction()
