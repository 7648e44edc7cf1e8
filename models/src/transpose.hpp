#pragma once

// PRIVATE to models/src: the transpose that turns Hugging Face's nn.Linear weights [out, in]
// into numesh's [in, out], on raw elements of 2 or 4 bytes.

#include <cstddef>
#include <cstdint>

namespace numesh::models::detail {

/// dst[c * dst_stride + r] = src[r * cols + c] for the row-major [rows, cols] matrix at src, of
/// elements of `size` bytes (2 or 4), walked in 64 x 64 tiles so that both the reads and the
/// writes stay within a few cache lines (element by element, the strided writes made loading
/// 4x slower).
/// REQUIRES: size is 2 or 4; dst_stride >= rows; the buffers do not overlap.
void transpose(const std::byte* src, std::int64_t rows, std::int64_t cols, std::size_t size,
               std::byte* dst, std::int64_t dst_stride);

}  // namespace numesh::models::detail
