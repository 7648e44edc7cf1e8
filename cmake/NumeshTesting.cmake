# numesh_add_test(name SOURCES... [LIBS ...] [LABELS ...]): one GoogleTest executable whose
# TESTs are each registered with CTest. A unity build in every configuration: the `portable`
# preset compiles the library file by file (each source checked to include what it uses) but
# its tests at -O3 in batches, where GoogleTest, Eigen and oneTBB's headers cost most.
include(GoogleTest)
function(numesh_add_test name)
  cmake_parse_arguments(ARG "" "" "LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_UNPARSED_ARGUMENTS})
  set_target_properties(${name} PROPERTIES UNITY_BUILD ON)
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gmock GTest::gtest_main
                        $<BUILD_INTERFACE:numesh_warnings>)
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60
                       PROPERTIES TIMEOUT 120 LABELS "${ARG_LABELS}")
endfunction()
