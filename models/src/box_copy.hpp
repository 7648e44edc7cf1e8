#pragma once

// PRIVATE to models/src: copying a rectangular box out of a dense row-major tensor with a dtype
// conversion on the way, the inner loop of reading a shard of a weight. The box is walked as
// runs of consecutive source elements (the innermost dims it covers fully, plus one), so a row
// block or a whole tensor is one run and a column block is one run per row.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "numesh/core/dtype.hpp"

namespace numesh::models::detail {

/// Checks a read of the box [offsets[d], offsets[d] + sizes[d]) of a tensor of `shape` into
/// `out_bytes` bytes of `target` elements, as every file format's read_box requires, and returns
/// the box's element count; `where` starts every message ("gguf: cannot read tensor 'x' of
/// 'f'").
/// Throws: ShapeError when offsets or sizes do not have one entry per dim, when the box leaves
/// the shape (naming the dim), or when `out_bytes` is not the box's storage as `target`;
/// ValueError when the box's rows are not whole blocks of `target`.
std::uint64_t check_box(std::string_view where, std::span<const std::int64_t> shape,
                        std::span<const std::int64_t> offsets, std::span<const std::int64_t> sizes,
                        DType target, std::size_t out_bytes);

/// Copies the box [offsets[d], offsets[d] + sizes[d]) of the dense row-major tensor of `shape`
/// at `src` (elements of `from`) to the dense row-major `dst` (elements of `to`), converted by
/// runtime::convert_elements.
/// REQUIRES: shape, offsets and sizes have the same length; the box lies inside the shape;
/// dst holds product(sizes) elements of `to`.
void copy_box(const std::byte* src, DType from, std::span<const std::int64_t> shape,
              std::span<const std::int64_t> offsets, std::span<const std::int64_t> sizes,
              std::byte* dst, DType to);

}  // namespace numesh::models::detail
