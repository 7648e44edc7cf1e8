#pragma once

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <cstdint>
#include <span>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

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
        for (std::int64_t b = r.begin(); b != r.end(); ++b)
          body(b * block, std::min(n, (b + 1) * block));
      },
      oneapi::tbb::simple_partitioner());
}

/// Runs body(i) for i in [0, n), one task each: which thread runs a task does not change what it
/// computes. Throws: what body throws.
template <typename Body>
void for_each_task(std::int64_t n, const Body& body) {
  parallel_blocks(n, 1, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t i = first; i < last; ++i) body(i);
  });
}

/// Blocks of per-thread scratch a kernel needs in an arena of max_concurrency `threads`: one
/// more than threads, because oneTBB's current_thread_index() runs "between 0 and the
/// task_arena concurrency level", both included (the oneAPI spec's this_task_arena; a device
/// arena of one thread ran its worker in slot 1).
inline std::int64_t arena_scratch_slots(std::int64_t threads) noexcept { return threads + 1; }

/// The calling thread's block of `per_thread` floats in `scratch` (arena_scratch_slots() blocks
/// of them): block current_thread_index().
/// Throws: IndexError when the thread's slot is outside the `slots` blocks.
inline float* thread_scratch(std::span<float> scratch, std::int64_t per_thread,
                             std::int64_t slots) {
  const auto slot = static_cast<std::int64_t>(oneapi::tbb::this_task_arena::current_thread_index());
  NUMESH_CHECK(slot >= 0 && slot < slots, IndexError,
               "thread slot {} outside the {} scratch blocks of this arena", slot, slots);
  return scratch.data() + slot * per_thread;
}

/// Rows per block for an element-wise pass over rows of `cols` values: about 16 Ki elements a
/// block (a task then costs far more than its ~1 us of scheduling), at least one row.
inline std::int64_t row_block_for(std::int64_t cols) noexcept {
  constexpr std::int64_t kElementsPerBlock = std::int64_t{1} << 14;
  return std::max<std::int64_t>(1, kElementsPerBlock / std::max<std::int64_t>(cols, 1));
}

}  // namespace numesh::ops
