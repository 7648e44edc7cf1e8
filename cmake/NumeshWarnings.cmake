# numesh_warnings: an INTERFACE target carrying the project's warning flags. Link it as
# $<BUILD_INTERFACE:numesh_warnings> so the flags never reach consumers.
add_library(numesh_warnings INTERFACE)
target_compile_options(numesh_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion
  $<$<BOOL:${NUMESH_WERROR}>:-Werror>)
