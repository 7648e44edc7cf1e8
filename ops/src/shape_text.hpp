#pragma once

// PRIVATE to ops/src: shapes in error messages.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>

#include "numesh/runtime/tensor.hpp"

namespace numesh::ops::detail {

/// "[2, 3]": a host tensor's shape for error messages.
inline std::string shape_text(const runtime::HostTensor& t) {
  return fmt::format("[{}]", fmt::join(t.shape, ", "));
}

}  // namespace numesh::ops::detail
