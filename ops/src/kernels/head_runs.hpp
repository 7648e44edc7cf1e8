#pragma once

// PRIVATE to ops/src/kernels: a slice's query heads as runs of at most kKeyBlockMaxHeads heads
// of one kv head, the units of decode and paged attention's tasks, so that a task reads its
// keys and values once for every query head of the run (grouped-query attention's heads share
// them).

#include <algorithm>
#include <cstdint>

#include "numesh/ops/kernels/attention_core.hpp"
#include "numesh/ops/kernels/key_block.hpp"

namespace numesh::ops::detail {

class HeadRuns {
 public:
  /// One run of heads: local query heads [first, first + heads) all read kv head kv_head
  /// (local to the slice's cache); heads is 0 for the runs a kv head with fewer heads leaves.
  struct Run {
    std::int64_t first = 0;
    std::int64_t heads = 0;
    std::int64_t kv_head = 0;
  };

  explicit HeadRuns(const AttentionSlice& sl) noexcept
      : sl_(sl),
        first_kv_(sl.q_head_offset / sl.group),
        kv_heads_((sl.q_head_offset + sl.q_heads - 1) / sl.group - first_kv_ + 1),
        per_kv_((std::min(sl.group, sl.q_heads) + kKeyBlockMaxHeads - 1) / kKeyBlockMaxHeads) {}

  /// Runs in all, empty ones included: run r is run r % per-kv-head of the slice's kv head
  /// r / per-kv-head.
  std::int64_t size() const noexcept { return kv_heads_ * per_kv_; }

  Run operator[](std::int64_t r) const noexcept {
    const std::int64_t c = r / per_kv_;
    const std::int64_t first = first_head(c) + (r % per_kv_) * kKeyBlockMaxHeads;
    return {first, std::clamp<std::int64_t>(first_head(c + 1) - first, 0, kKeyBlockMaxHeads),
            first_kv_ + c - sl_.kv_head_offset};
  }

 private:
  // The slice's first query head of its c-th kv head (counted from the first it reads).
  std::int64_t first_head(std::int64_t c) const noexcept {
    return std::clamp<std::int64_t>((first_kv_ + c) * sl_.group - sl_.q_head_offset, 0,
                                    sl_.q_heads);
  }

  AttentionSlice sl_;
  std::int64_t first_kv_, kv_heads_, per_kv_;
};

}  // namespace numesh::ops::detail
