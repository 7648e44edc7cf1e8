#include "numesh/ops/kernels/attention_core.hpp"

#include <oneapi/tbb/task_arena.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "head_runs.hpp"
#include "key_block_merge.hpp"
#include "kv_rows.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/eigen_views.hpp"
#include "numesh/ops/kernels/exp_kernels.hpp"
#include "numesh/ops/kernels/gemm.hpp"
#include "numesh/ops/kernels/key_block.hpp"
#include "numesh/ops/kernels/parallel.hpp"
#include "numesh/ops/kernels/rope.hpp"
#include "numesh/runtime/convert.hpp"
#include "numesh/runtime/cpu_features.hpp"

namespace numesh::ops {

namespace {

// Queries per GEMM block in the blocked path, and the query count from which it is used.
constexpr std::int64_t kQueryBlock = 64;
constexpr std::int64_t kBlockedFrom = 16;

// The stable softmax of row[0, visible), zeros in [visible, row.size()).
void softmax_prefix(float* row, std::int64_t visible, std::int64_t width) {
  softmax_row(row, visible, width, runtime::kernel_level());
}

// One query at a time: dot products against each visible key (decode).
void attention_rows(const float* q, const KvView& kv, float* out, const AttentionSlice& sl,
                    std::int64_t d, std::int64_t q_offset, bool causal, float* scores) {
  using Vec = Eigen::Map<const Eigen::VectorXf>;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (std::int64_t bi = 0; bi < sl.batch; ++bi) {
    for (std::int64_t h = 0; h < sl.q_heads; ++h) {
      const std::int64_t kvh = (sl.q_head_offset + h) / sl.group - sl.kv_head_offset;
      const float* kb =
          static_cast<const float*>(kv.k) + bi * kv.batch_stride + kvh * kv.head_stride;
      const float* vb =
          static_cast<const float*>(kv.v) + bi * kv.batch_stride + kvh * kv.head_stride;
      for (std::int64_t ti = 0; ti < sl.q_len; ++ti) {
        const Vec qr(q + ((bi * sl.q_len + ti) * sl.q_heads + h) * d, d);
        const std::int64_t visible = causal ? q_offset + ti + 1 : sl.kv_len;
        for (std::int64_t si = 0; si < visible; ++si)
          scores[si] = qr.dot(Vec(kb + si * kv.pos_stride, d)) * scale;
        softmax_prefix(scores, visible, visible);
        Eigen::Map<Eigen::VectorXf> orow(out + ((bi * sl.q_len + ti) * sl.q_heads + h) * d, d);
        orow.setZero();
        for (std::int64_t si = 0; si < visible; ++si)
          orow += scores[si] * Vec(vb + si * kv.pos_stride, d);
      }
    }
  }
}

// Decode splits the keys into blocks of this many (flash-decoding): with few queries the
// parallel work is (sequence, run of query heads of one kv head, key block), and the blocks'
// softmax statistics are merged in block order.
constexpr std::int64_t kKeyBlock = 256;

std::int64_t key_blocks(std::int64_t kv_len) noexcept {
  return (kv_len + kKeyBlock - 1) / kKeyBlock;
}
std::int64_t query_blocks(std::int64_t q_len) noexcept {
  return (q_len + kQueryBlock - 1) / kQueryBlock;
}

// Per-thread scratch floats of each path, and the decode path's shared partials (per query and
// key block: the block's max score, its sum of exponentials and its weighted sum of values).
std::int64_t per_thread_floats(std::int64_t q_len, std::int64_t kv_capacity, std::int64_t d,
                               DType kv_dtype) noexcept {
  if (q_len < kBlockedFrom) return kKeyBlock * kKeyBlockMaxHeads;
  // A 16-bit cache's keys and values of one (sequence, kv head) widened for the GEMMs.
  const std::int64_t widened = kv_dtype == DType::kF32 ? 0 : 2 * kv_capacity * d;
  return kQueryBlock * kv_capacity + widened;
}
std::int64_t partial_floats(const AttentionSlice& sl, std::int64_t d) noexcept {
  return sl.q_len < kBlockedFrom
             ? sl.batch * sl.q_heads * sl.q_len * key_blocks(sl.kv_len) * (d + 2)
             : 0;
}

// Decode (fewer than kBlockedFrom queries): tasks over (sequence, run of query heads of one kv
// head, key block) each write the block's statistics for every query of the run's heads, reading
// the block's keys and values once for them all; then tasks over (sequence, head) merge the
// blocks.
void attention_decode(const float* q, const KvView& kv, float* out, const AttentionSlice& sl,
                      std::int64_t d, std::int64_t q_offset, bool causal, std::span<float> scratch,
                      std::int64_t per_thread) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const std::int64_t blocks = key_blocks(sl.kv_len), stride = d + 2;
  const std::int64_t slots = arena_scratch_slots(oneapi::tbb::this_task_arena::max_concurrency());
  float* partials = scratch.data() + slots * per_thread;
  const runtime::KernelLevel level = runtime::kernel_level();
  const detail::HeadRuns runs(sl);
  // Partial (b, h, t, block) lives at ((((b * q_heads + h) * q_len + t) * blocks + block) * stride.
  detail::with_kv_element(kv.dtype, [&]<class T>() {
    for_each_task(sl.batch * runs.size() * blocks, [&](std::int64_t task) {
      const std::int64_t block = task % blocks, bi = task / blocks / runs.size();
      const detail::HeadRuns::Run run = runs[task / blocks % runs.size()];
      if (run.heads == 0) return;
      const T* kb =
          static_cast<const T*>(kv.k) + bi * kv.batch_stride + run.kv_head * kv.head_stride;
      const T* vb =
          static_cast<const T*>(kv.v) + bi * kv.batch_stride + run.kv_head * kv.head_stride;
      float* scores = thread_scratch(scratch, per_thread, slots);
      const std::int64_t part_stride = sl.q_len * blocks * stride;  // from head h to h + 1
      for (std::int64_t ti = 0; ti < sl.q_len; ++ti) {
        float* part =
            partials + (((bi * sl.q_heads + run.first) * sl.q_len + ti) * blocks + block) * stride;
        const std::int64_t visible = causal ? q_offset + ti + 1 : sl.kv_len;
        const std::int64_t first = block * kKeyBlock, last = std::min(visible, first + kKeyBlock);
        if (last <= first) {  // the mask hides the whole block
          for (std::int64_t g = 0; g < run.heads; ++g) {
            float* p = part + g * part_stride;
            p[0] = -std::numeric_limits<float>::infinity();
            p[1] = 0.0f;
            std::fill(p + 2, p + 2 + d, 0.0f);
          }
          continue;
        }
        const T* keys[kKeyBlock];
        const T* values[kKeyBlock];
        for (std::int64_t si = first; si < last; ++si) {
          keys[si - first] = kb + si * kv.pos_stride;
          values[si - first] = vb + si * kv.pos_stride;
        }
        KeyBlockStats stats[kKeyBlockMaxHeads];
        detail::attend_rows(q + ((bi * sl.q_len + ti) * sl.q_heads + run.first) * d, d, run.heads,
                            keys, values, kv.dtype, last - first, d, scale, scores, part + 2,
                            part_stride, stats, level);
        for (std::int64_t g = 0; g < run.heads; ++g) {
          part[g * part_stride] = stats[g].max;
          part[g * part_stride + 1] = stats[g].sum;
        }
      }
    });
  });
  detail::merge_key_blocks(partials, sl.batch, sl.q_heads, sl.q_len, blocks, d, stride, out);
}

// rows [0, n) of d 16-bit elements (bf16 or f16 bits), `stride` elements apart, widened into
// out[n * d] (exact): in one call when the rows lie end to end (a head-major cache).
void widen_rows(DType dtype, const std::uint16_t* rows, std::int64_t stride, std::int64_t n,
                std::int64_t d, float* out) {
  if (stride == d) {
    runtime::convert_elements(rows, dtype, out, DType::kF32, static_cast<std::size_t>(n * d));
    return;
  }
  for (std::int64_t r = 0; r < n; ++r) {
    runtime::convert_elements(rows + r * stride, dtype, out + r * d, DType::kF32,
                              static_cast<std::size_t>(d));
  }
}

// Prefill: tasks over (sequence, head, block of 64 queries), each two GEMMs (q k^T, then p v)
// around a row softmax, reading q, keys, values and writing out in place through their strides,
// skipping the key blocks the causal mask hides.
void attention_blocked(const float* q, const KvView& kv, float* out, const AttentionSlice& sl,
                       std::int64_t d, std::int64_t q_offset, bool causal, std::span<float> scratch,
                       std::int64_t per_thread) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const std::int64_t s_len = sl.kv_len, qb = query_blocks(sl.q_len), row_stride = sl.q_heads * d;
  const std::int64_t slots = arena_scratch_slots(oneapi::tbb::this_task_arena::max_concurrency());
  for_each_task(sl.batch * sl.q_heads * qb, [&](std::int64_t task) {
    const std::int64_t block = task % qb, bh = task / qb, h = bh % sl.q_heads, bi = bh / sl.q_heads;
    const std::int64_t kvh = (sl.q_head_offset + h) / sl.group - sl.kv_head_offset;
    const std::int64_t offset = bi * kv.batch_stride + kvh * kv.head_stride;
    const std::int64_t i0 = block * kQueryBlock, rows = std::min(kQueryBlock, sl.q_len - i0);
    // Keys any query of the block may see: the causal mask hides the rest.
    const std::int64_t width = causal ? std::min(s_len, q_offset + i0 + rows) : s_len;
    float* scores = thread_scratch(scratch, per_thread, slots);
    const float* kb = nullptr;
    const float* vb = nullptr;
    std::int64_t pos_stride = kv.pos_stride;
    if (kv.dtype == DType::kF32) {
      kb = static_cast<const float*>(kv.k) + offset;
      vb = static_cast<const float*>(kv.v) + offset;
    } else {
      // A 16-bit cache: the block's visible keys and values widened after the scores' block
      // (the GEMMs then see the fp32 rows a decode step's kernel widens as it loads them).
      float* wk = scores + kQueryBlock * s_len;
      float* wv = wk + s_len * d;
      widen_rows(kv.dtype, static_cast<const std::uint16_t*>(kv.k) + offset, kv.pos_stride, width,
                 d, wk);
      widen_rows(kv.dtype, static_cast<const std::uint16_t*>(kv.v) + offset, kv.pos_stride, width,
                 d, wv);
      kb = wk;
      vb = wv;
      pos_stride = d;
    }
    const float* q_rows = q + ((bi * sl.q_len + i0) * sl.q_heads + h) * d;
    float* out_rows = out + ((bi * sl.q_len + i0) * sl.q_heads + h) * d;
    gemm(rows, width, d, scale, q_rows, row_stride, kb, pos_stride, /*transpose_b=*/true, 0.0f,
         scores, width);
    for (std::int64_t r = 0; r < rows; ++r) {
      softmax_prefix(scores + r * width, causal ? q_offset + i0 + r + 1 : s_len, width);
    }
    gemm(rows, d, width, 1.0f, scores, width, vb, pos_stride, /*transpose_b=*/false, 0.0f, out_rows,
         row_stride);
  });
}

}  // namespace

std::int64_t attention_scratch_floats(const AttentionSlice& slice, std::int64_t head_dim,
                                      std::int64_t threads, DType kv_dtype) noexcept {
  return arena_scratch_slots(threads) *
             per_thread_floats(slice.q_len, slice.kv_len, head_dim, kv_dtype) +
         partial_floats(slice, head_dim);
}

void check_kv_dtype(DType dtype, std::int64_t head_dim, std::string_view who) {
  NUMESH_CHECK(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16, TypeError,
               "{}: keys and values stored as {}: expected f32, bf16 or f16", who,
               to_string(dtype));
  NUMESH_CHECK(dtype == DType::kF32 || head_dim % 16 == 0, ShapeError,
               "{}: a {} KV cache needs a head size that is a multiple of 16, not {}", who,
               to_string(dtype), head_dim);
}

KvView KvView::from_sequence(std::int64_t b) const noexcept {
  const std::int64_t bytes = b * batch_stride * static_cast<std::int64_t>(dtype_size(dtype));
  KvView view = *this;
  view.k = static_cast<const std::byte*>(k) + bytes;
  view.v = static_cast<const std::byte*>(v) + bytes;
  return view;
}

void attention_core(const float* q, const KvView& kv, float* out, const AttentionSlice& sl,
                    std::int64_t d, std::int64_t q_offset, bool causal, std::span<float> scratch) {
  // One block of scratch per arena slot, then (decode) the partials, laid out for this call's
  // sizes: a scratch sized for a larger capacity holds them too.
  const std::int64_t threads = oneapi::tbb::this_task_arena::max_concurrency();
  const std::int64_t per_thread = per_thread_floats(sl.q_len, sl.kv_len, d, kv.dtype);
  const std::int64_t needed = attention_scratch_floats(sl, d, threads, kv.dtype);
  NUMESH_CHECK(static_cast<std::int64_t>(scratch.size()) >= needed, ShapeError,
               "attention: scratch of {} floats; {} keys, {} queries and {} threads need {}",
               scratch.size(), sl.kv_len, sl.q_len, threads, needed);
  check_kv_dtype(kv.dtype, d, "attention");
  if (sl.q_len < kBlockedFrom) {
    attention_decode(q, kv, out, sl, d, q_offset, causal, scratch, per_thread);
  } else {
    attention_blocked(q, kv, out, sl, d, q_offset, causal, scratch, per_thread);
  }
}

void attention_kernel(float* q, float* k, const float* v, float* out, const AttentionSlice& sl,
                      const AttentionConfig& config, std::span<float> scratch) {
  const std::int64_t d = config.head_dim;
  if (config.rope_theta > 0.0f) {
    rope_inplace(q, sl.batch, sl.q_len, sl.q_heads, d, config.q_offset, config.rope_theta,
                 config.rope_scaling);
    rope_inplace(k, sl.batch, sl.kv_len, sl.kv_heads, d, 0, config.rope_theta, config.rope_scaling);
  }
  const KvView kv{.k = k,
                  .v = v,
                  .batch_stride = sl.kv_len * sl.kv_heads * d,
                  .pos_stride = sl.kv_heads * d,
                  .head_stride = d};
  // One query at a time: the plain fp32 algorithm, a single-thread baseline for ops_bench.
  attention_rows(q, kv, out, sl, d, config.q_offset, config.causal, scratch.data());
}

}  // namespace numesh::ops
