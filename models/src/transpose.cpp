#include "transpose.hpp"

#include <algorithm>
#include <cstring>

namespace numesh::models::detail {

namespace {

template <typename T>
void transpose_as(const std::byte* src, std::int64_t rows, std::int64_t cols, std::byte* dst,
                  std::int64_t dst_stride) {
  constexpr std::int64_t kTile = 64;
  for (std::int64_t r0 = 0; r0 < rows; r0 += kTile) {
    for (std::int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const std::int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      for (std::int64_t r = r0; r < r1; ++r) {
        for (std::int64_t c = c0; c < c1; ++c) {
          // memcpy: the buffers are bytes of a mapping or a shard, not T objects.
          std::memcpy(dst + (c * dst_stride + r) * static_cast<std::int64_t>(sizeof(T)),
                      src + (r * cols + c) * static_cast<std::int64_t>(sizeof(T)), sizeof(T));
        }
      }
    }
  }
}

}  // namespace

void transpose(const std::byte* src, std::int64_t rows, std::int64_t cols, std::size_t size, std::byte* dst,
               std::int64_t dst_stride) {
  if (size == 2) {
    transpose_as<std::uint16_t>(src, rows, cols, dst, dst_stride);
  } else {
    transpose_as<std::uint32_t>(src, rows, cols, dst, dst_stride);
  }
}

}  // namespace numesh::models::detail
