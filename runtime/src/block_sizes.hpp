#pragma once

#include <cstddef>
#include <string_view>

#include "numesh/core/check.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"

// PRIVATE to runtime/src: the size check every block codec (block_*.cpp) starts with.

namespace numesh::runtime::detail {

/// Refuses `values` that are not `blocks` whole blocks of `format` with ShapeError "WHAT FORMAT:
/// V values for B block(s) of E: expected N values" (`what`: "quantize" or "dequantize").
inline void check_block_sizes(std::string_view what, DType format, std::size_t values,
                              std::size_t blocks) {
  const auto elements = static_cast<std::size_t>(traits(format).block_elements);
  NUMESH_CHECK(values / elements == blocks && values % elements == 0, ShapeError,
               "{} {}: {} values for {} block(s) of {}: expected {} values", what,
               to_string(format), values, blocks, elements, blocks * elements);
}

}  // namespace numesh::runtime::detail
