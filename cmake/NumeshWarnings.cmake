# numesh_warnings: an INTERFACE target carrying the project's warning flags. Link it as
# $<BUILD_INTERFACE:numesh_warnings> so the flags never reach consumers.
add_library(numesh_warnings INTERFACE)
target_compile_options(numesh_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion
  $<$<BOOL:${NUMESH_WERROR}>:-Werror>)

# GCC 12 (Debian 12's) warns falsely at -O2 and above where the flags below are kept as errors:
# -Wuninitialized and -Wmaybe-uninitialized on the `__Y` of its own AVX-512 headers'
# `_mm512_undefined_*` (thousands of lines for the kernels; GCC 13 no longer warns), on
# std::optional's payload, and -Wrestrict inside std::string's inlined copies. Where the code
# is optimized, GCC before 13 leaves these three to clang (the sanitize and tsan presets build
# with -Werror and clang warns on uninitialized reads at any optimization level) and to the
# Debug build.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  target_compile_options(numesh_warnings INTERFACE
    $<$<NOT:$<CONFIG:Debug>>:-Wno-uninitialized -Wno-maybe-uninitialized -Wno-restrict>)
endif()
