#include "transpose.hpp"

#include <algorithm>

namespace numesh::models::detail {

namespace {

template <typename T>
void transpose_as(const std::byte* src_bytes, std::int64_t rows, std::int64_t cols,
                  std::byte* dst_bytes, std::int64_t dst_stride) {
  // The buffers hold T-sized values (a mapping's or a shard's), read and written as T.
  const T* src = reinterpret_cast<const T*>(src_bytes);
  T* dst = reinterpret_cast<T*>(dst_bytes);
  constexpr std::int64_t kTile = 64;
  constexpr std::int64_t kInner =
      8;  // 8 source rows at a time: 8 contiguous dst elements per column
  for (std::int64_t r0 = 0; r0 < rows; r0 += kTile) {
    for (std::int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const std::int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      std::int64_t r = r0;
      for (; r + kInner <= r1; r += kInner) {
        for (std::int64_t c = c0; c < c1; ++c) {
          T* out = dst + c * dst_stride + r;
          for (std::int64_t i = 0; i < kInner; ++i) out[i] = src[(r + i) * cols + c];
        }
      }
      for (; r < r1; ++r) {
        for (std::int64_t c = c0; c < c1; ++c) dst[c * dst_stride + r] = src[r * cols + c];
      }
    }
  }
}

}  // namespace

void transpose(const std::byte* src, std::int64_t rows, std::int64_t cols, std::size_t size,
               std::byte* dst, std::int64_t dst_stride) {
  if (size == 2) {
    transpose_as<std::uint16_t>(src, rows, cols, dst, dst_stride);
  } else {
    transpose_as<std::uint32_t>(src, rows, cols, dst, dst_stride);
  }
}

}  // namespace numesh::models::detail
