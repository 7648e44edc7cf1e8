#pragma once

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>

#include <algorithm>
#include <cstdint>

// How kernels spread their work over the calling thread's oneTBB arena (a device's threads when
// they run in a node body): in blocks fixed by the shapes, never by the thread count, so a kernel
// computes the same bits in an arena of any size.

namespace numesh::ops {

/// Runs body(begin, end) for the blocks [0, block), [block, 2 block), ... of [0, n) (the last
/// one shorter), each block one task of the calling thread's arena; a single block runs on the
/// calling thread. REQUIRES: block > 0. Throws: what body throws (the first, once).
template <typename Body>
void parallel_blocks(std::int64_t n, std::int64_t block, const Body& body) {
  if (n <= 0) return;
  const std::int64_t blocks = (n + block - 1) / block;
  if (blocks == 1) {
    body(std::int64_t{0}, n);
    return;
  }
  oneapi::tbb::parallel_for(
      oneapi::tbb::blocked_range<std::int64_t>(0, blocks, 1),
      [&](const oneapi::tbb::blocked_range<std::int64_t>& r) {
        for (std::int64_t b = r.begin(); b != r.end(); ++b) body(b * block, std::min(n, (b + 1) * block));
      },
      oneapi::tbb::simple_partitioner());
}

/// Rows per block for an element-wise pass over rows of `cols` values: about 16 Ki elements a
/// block (a task then costs far more than its ~1 us of scheduling), at least one row.
inline std::int64_t row_block_for(std::int64_t cols) noexcept {
  constexpr std::int64_t kElementsPerBlock = std::int64_t{1} << 14;
  return std::max<std::int64_t>(1, kElementsPerBlock / std::max<std::int64_t>(cols, 1));
}

}  // namespace numesh::ops
