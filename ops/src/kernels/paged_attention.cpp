#include "numesh/ops/kernels/paged_attention.hpp"

#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "head_runs.hpp"
#include "key_block_merge.hpp"
#include "kv_rows.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/kernels/key_block.hpp"
#include "numesh/ops/kernels/parallel.hpp"
#include "numesh/runtime/cpu_features.hpp"

namespace numesh::ops {

namespace {

// Keys per task, as attention_core's decode path splits them (so the two agree bitwise).
constexpr std::int64_t kPagedKeyBlock = 256;

std::int64_t paged_key_blocks(std::int64_t context) noexcept {
  return (context + kPagedKeyBlock - 1) / kPagedKeyBlock;
}

}  // namespace

std::int64_t paged_attention_scratch_floats(std::int64_t tokens, std::int64_t q_heads,
                                            std::int64_t head_dim, std::int64_t max_context,
                                            std::int64_t threads) noexcept {
  return arena_scratch_slots(threads) * kPagedKeyBlock * kKeyBlockMaxHeads +
         tokens * q_heads * paged_key_blocks(max_context) * (head_dim + 2);
}

void paged_attention(const float* q, const PagedKvView& kv, const RaggedKeys& keys, float* out,
                     std::int64_t tokens, const AttentionSlice& sl, std::int64_t d,
                     std::int64_t max_context, std::span<float> scratch) {
  const bool spans_fit = static_cast<std::int64_t>(keys.context.size()) == tokens &&
                         static_cast<std::int64_t>(keys.table_of.size()) == tokens;
  NUMESH_CHECK(spans_fit, ShapeError,
               "paged attention: {} tokens, {} context lengths and {} table offsets", tokens,
               keys.context.size(), keys.table_of.size());
  const std::int64_t threads = oneapi::tbb::this_task_arena::max_concurrency();
  const std::int64_t needed =
      paged_attention_scratch_floats(tokens, sl.q_heads, d, max_context, threads);
  NUMESH_CHECK(static_cast<std::int64_t>(scratch.size()) >= needed, ShapeError,
               "paged attention: scratch of {} floats; {} tokens of up to {} keys and {} "
               "threads need {}",
               scratch.size(), tokens, max_context, threads, needed);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const std::int64_t blocks = paged_key_blocks(max_context), stride = d + 2;
  const std::int64_t slots = arena_scratch_slots(threads);
  float* partials = scratch.data() + slots * kPagedKeyBlock * kKeyBlockMaxHeads;
  const runtime::KernelLevel level = runtime::kernel_level();
  const detail::HeadRuns runs(sl);
  // Partial (t, h, block) lives at ((t * q_heads + h) * blocks + block) * stride.
  check_kv_dtype(kv.dtype, d, "paged attention");
  detail::with_kv_element(kv.dtype, [&]<class T>() {
    for_each_task(tokens * runs.size() * blocks, [&](std::int64_t task) {
      const std::int64_t block = task % blocks, t = task / blocks / runs.size();
      const detail::HeadRuns::Run run = runs[task / blocks % runs.size()];
      if (run.heads == 0) return;
      const std::int64_t h0 = run.first, heads = run.heads, kvh = run.kv_head;
      const std::int32_t* table = keys.tables.data() + keys.table_of[static_cast<std::size_t>(t)];
      const std::int64_t visible = keys.context[static_cast<std::size_t>(t)];
      float* part = partials + ((t * sl.q_heads + h0) * blocks + block) * stride;
      const std::int64_t part_stride = blocks * stride;  // from head h to h + 1
      const std::int64_t first = block * kPagedKeyBlock,
                         last = std::min(visible, first + kPagedKeyBlock);
      if (last <= first) {  // past the token's context
        for (std::int64_t g = 0; g < heads; ++g) {
          float* p = part + g * part_stride;
          p[0] = -std::numeric_limits<float>::infinity();
          p[1] = 0.0f;
          std::fill(p + 2, p + 2 + d, 0.0f);
        }
        return;
      }
      // Key si's row: slot si % block_size of block table[si / block_size].
      const auto row = [&](const T* base, std::int64_t si) {
        return base + table[si / kv.block_size] * kv.block_stride + kvh * kv.head_stride +
               (si % kv.block_size) * kv.pos_stride;
      };
      float* scores = thread_scratch(scratch, kPagedKeyBlock * kKeyBlockMaxHeads, slots);
      const T* key_rows[kPagedKeyBlock];
      const T* value_rows[kPagedKeyBlock];
      for (std::int64_t si = first; si < last; ++si) {
        key_rows[si - first] = row(static_cast<const T*>(kv.k), si);
        value_rows[si - first] = row(static_cast<const T*>(kv.v), si);
      }
      KeyBlockStats stats[kKeyBlockMaxHeads];
      detail::attend_rows(q + (t * sl.q_heads + h0) * d, d, heads, key_rows, value_rows, kv.dtype,
                          last - first, d, scale, scores, part + 2, part_stride, stats, level);
      for (std::int64_t g = 0; g < heads; ++g) {
        part[g * part_stride] = stats[g].max;
        part[g * part_stride + 1] = stats[g].sum;
      }
    });
  });
  detail::merge_key_blocks(partials, tokens, sl.q_heads, 1, blocks, d, stride, out);
}

}  // namespace numesh::ops
