#pragma once

// PRIVATE to models/src: copying a rectangular box out of a dense row-major tensor with a dtype
// conversion on the way, the inner loop of reading a shard of a weight. The box is walked as
// runs of consecutive source elements (the innermost dims it covers fully, plus one), so a row
// block or a whole tensor is one run and a column block is one run per row.

#include <cstddef>
#include <cstdint>
#include <span>

#include "numesh/core/dtype.hpp"

namespace numesh::models::detail {

/// Copies the box [offsets[d], offsets[d] + sizes[d]) of the dense row-major tensor of `shape`
/// at `src` (elements of `from`) to the dense row-major `dst` (elements of `to`), converted by
/// runtime::convert_elements.
/// REQUIRES: shape, offsets and sizes have the same length; the box lies inside the shape;
/// dst holds product(sizes) elements of `to`.
void copy_box(const std::byte* src, DType from, std::span<const std::int64_t> shape,
              std::span<const std::int64_t> offsets, std::span<const std::int64_t> sizes,
              std::byte* dst, DType to);

}  // namespace numesh::models::detail
