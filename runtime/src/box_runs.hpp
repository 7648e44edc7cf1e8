#pragma once

// PRIVATE: the odometer behind copy_box and the box reductions of the sharded collectives.

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "numesh/sharding/shard_layout.hpp"

namespace numesh::runtime::detail {

/// Number of elements in `box` (the product of its extents; 1 for rank 0).
inline std::int64_t volume(std::span<const sharding::DimSlice> box) {
  std::int64_t v = 1;
  for (const sharding::DimSlice& d : box) v *= d.extent;
  return v;
}

/// Calls fn(src_offset, dst_offset, run) for every contiguous run of `box` (global coordinates)
/// inside a row-major source holding `src_slices` and a row-major destination holding
/// `dst_slices`; offsets are in elements. Trailing dims that are whole in both tensors merge
/// into one run, so a box of whole rows is a single call.
/// REQUIRES: the box lies inside both slices; all three have the same rank.
template <typename Fn>
void for_each_run(std::span<const sharding::DimSlice> box,
                  std::span<const sharding::DimSlice> src_slices,
                  std::span<const sharding::DimSlice> dst_slices, Fn&& fn) {
  const std::size_t rank = box.size();
  if (rank == 0) {
    fn(std::int64_t{0}, std::int64_t{0}, std::int64_t{1});
    return;
  }
  // Strides and the odometer live on the stack for ranks up to kInlineRank: this runs inside
  // collective node bodies, which must not allocate on the steady path.
  constexpr std::size_t kInlineRank = 8;
  std::array<std::int64_t, 3 * kInlineRank> inline_buffer;
  std::vector<std::int64_t> heap_buffer;
  std::int64_t* buffer = inline_buffer.data();
  if (rank > kInlineRank) {
    heap_buffer.resize(3 * rank);
    buffer = heap_buffer.data();
  }
  std::int64_t* src_stride = buffer;
  std::int64_t* dst_stride = buffer + rank;
  std::int64_t* index = buffer + 2 * rank;
  src_stride[rank - 1] = 1;
  dst_stride[rank - 1] = 1;
  for (std::size_t d = rank - 1; d > 0; --d) {
    src_stride[d - 1] = src_stride[d] * src_slices[d].extent;
    dst_stride[d - 1] = dst_stride[d] * dst_slices[d].extent;
  }
  std::size_t inner = rank - 1;
  std::int64_t run = box[inner].extent;
  while (inner > 0 && box[inner].extent == src_slices[inner].extent &&
         box[inner].extent == dst_slices[inner].extent) {
    --inner;
    run *= box[inner].extent;
  }
  std::int64_t src_base = 0, dst_base = 0;
  for (std::size_t d = 0; d < rank; ++d) {
    src_base += (box[d].offset - src_slices[d].offset) * src_stride[d];
    dst_base += (box[d].offset - dst_slices[d].offset) * dst_stride[d];
  }
  std::fill(index, index + inner, 0);
  while (true) {
    std::int64_t s = src_base, t = dst_base;
    for (std::size_t d = 0; d < inner; ++d) {
      s += index[d] * src_stride[d];
      t += index[d] * dst_stride[d];
    }
    fn(s, t, run);
    std::size_t d = inner;
    while (true) {
      if (d == 0) return;
      --d;
      if (++index[d] < box[d].extent) break;
      index[d] = 0;
    }
  }
}

}  // namespace numesh::runtime::detail
