#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

#include "numesh/core/error.hpp"

/// NUMESH_CHECK(cond, ErrorType, fmt, args...): throws ErrorType(fmt::format(fmt, args...))
/// when `cond` is false. For conditions a caller can trigger (bad input, bad configuration).
#define NUMESH_CHECK(cond, ErrorType, ...)       \
  do {                                           \
    if (!(cond)) [[unlikely]] {                  \
      throw ErrorType(fmt::format(__VA_ARGS__)); \
    }                                            \
  } while (0)

/// NUMESH_DCHECK(cond): aborts with the file and line in debug builds when an internal
/// invariant does not hold; compiles to nothing under NDEBUG. Never for user-triggered input.
#ifdef NDEBUG
#define NUMESH_DCHECK(cond) \
  do {                      \
  } while (0)
#else
#define NUMESH_DCHECK(cond)                                                                    \
  do {                                                                                         \
    if (!(cond)) [[unlikely]] {                                                                \
      std::fprintf(stderr, "numesh: internal check failed at %s:%d: %s\n", __FILE__, __LINE__, \
                   #cond);                                                                     \
      std::abort();                                                                            \
    }                                                                                          \
  } while (0)
#endif
