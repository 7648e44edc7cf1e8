#include "numesh/ops/kernels/attention_backward.hpp"

#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/kernels/gemm.hpp"
#include "numesh/ops/kernels/parallel.hpp"

namespace numesh::ops {

namespace {

// Blocks of queries (pass 1) and of keys (pass 2), as the forward's prefill path.
constexpr std::int64_t kBlock = 64;

std::int64_t blocks_of(std::int64_t n) noexcept { return (n + kBlock - 1) / kBlock; }

// Per thread: pass 1 holds P and dP for a block of queries over every key ([64, kv_len] twice),
// pass 2 the same for a block of queries over a block of keys.
std::int64_t per_thread(const AttentionSlice& sl) noexcept {
  return 2 * kBlock * std::max(sl.kv_len, kBlock);
}

// Per query row (sequence, head, token): its log-sum-exp and rowsum(P .* dP).
std::int64_t row_stats(const AttentionSlice& sl) noexcept {
  return 2 * sl.batch * sl.q_heads * sl.q_len;
}

}  // namespace

std::int64_t attention_backward_scratch_floats(const AttentionSlice& slice,
                                               std::int64_t /*head_dim*/,
                                               std::int64_t threads) noexcept {
  return arena_scratch_slots(threads) * per_thread(slice) + row_stats(slice);
}

void attention_core_backward(const float* q, const float* k, const float* v, const float* d_out,
                             float* dq, float* dk, float* dv, const AttentionSlice& sl,
                             std::int64_t d, std::int64_t q_offset, bool causal,
                             std::span<float> scratch) {
  const std::int64_t threads = oneapi::tbb::this_task_arena::max_concurrency();
  const std::int64_t needed = attention_backward_scratch_floats(sl, d, threads);
  NUMESH_CHECK(
      static_cast<std::int64_t>(scratch.size()) >= needed, ShapeError,
      "attention backward: scratch of {} floats; {} keys, {} queries and {} threads need {}",
      scratch.size(), sl.kv_len, sl.q_len, threads, needed);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const std::int64_t slots = arena_scratch_slots(threads), per = per_thread(sl);
  const std::int64_t q_stride = sl.q_heads * d, kv_stride = sl.kv_heads * d;  // floats per token
  float* lse = scratch.data() + slots * per;               // [batch, q_heads, q_len]
  float* rowsum = lse + sl.batch * sl.q_heads * sl.q_len;  // likewise
  const std::int64_t s_len = sl.kv_len, qb = blocks_of(sl.q_len);
  auto kv_head_of = [&](std::int64_t h) {
    return (sl.q_head_offset + h) / sl.group - sl.kv_head_offset;
  };
  auto visible = [&](std::int64_t t) { return causal ? std::min(s_len, q_offset + t + 1) : s_len; };

  // Pass 1: dq, and each query row's log-sum-exp and rowsum(P .* dP).
  for_each_task(sl.batch * sl.q_heads * qb, [&](std::int64_t task) {
    const std::int64_t block = task % qb, bh = task / qb, h = bh % sl.q_heads, bi = bh / sl.q_heads;
    const std::int64_t kvh = kv_head_of(h);
    const float* kb = k + bi * s_len * kv_stride + kvh * d;
    const float* vb = v + bi * s_len * kv_stride + kvh * d;
    const std::int64_t i0 = block * kBlock, rows = std::min(kBlock, sl.q_len - i0);
    const std::int64_t width = causal ? std::min(s_len, q_offset + i0 + rows) : s_len;
    float* p = thread_scratch(scratch, per, slots);
    float* dp = p + kBlock * width;
    const std::int64_t at = (bi * sl.q_len + i0) * q_stride + h * d;
    gemm(rows, width, d, scale, q + at, q_stride, kb, kv_stride, /*transpose_b=*/true, 0.0f, p,
         width);
    gemm(rows, width, d, 1.0f, d_out + at, q_stride, vb, kv_stride, /*transpose_b=*/true, 0.0f, dp,
         width);
    for (std::int64_t r = 0; r < rows; ++r) {
      float* pr = p + r * width;
      float* dpr = dp + r * width;
      const std::int64_t seen = visible(i0 + r);
      float top = -std::numeric_limits<float>::infinity();
      for (std::int64_t j = 0; j < seen; ++j) top = std::max(top, pr[j]);
      double total = 0.0;
      for (std::int64_t j = 0; j < seen; ++j) total += std::exp(static_cast<double>(pr[j] - top));
      const auto log_total = static_cast<float>(std::log(total));
      double sum_pdp = 0.0;
      for (std::int64_t j = 0; j < seen; ++j) {
        pr[j] = std::exp(pr[j] - top - log_total);
        sum_pdp += static_cast<double>(pr[j]) * dpr[j];
      }
      const auto delta = static_cast<float>(sum_pdp);
      for (std::int64_t j = 0; j < seen; ++j) pr[j] *= dpr[j] - delta;  // dS
      std::fill(pr + seen, pr + width, 0.0f);
      const std::int64_t stat = (bi * sl.q_heads + h) * sl.q_len + i0 + r;
      lse[stat] = top + log_total;
      rowsum[stat] = delta;
    }
    gemm(rows, d, width, scale, p, width, kb, kv_stride, /*transpose_b=*/false, 0.0f, dq + at,
         q_stride);
  });

  // Pass 2: dk and dv, per block of keys of one kv head, over every query that sees them.
  const std::int64_t kb_count = blocks_of(s_len);
  for_each_task(sl.batch * sl.kv_heads * kb_count, [&](std::int64_t task) {
    const std::int64_t block = task % kb_count, bkv = task / kb_count, kvh = bkv % sl.kv_heads,
                       bi = bkv / sl.kv_heads;
    const std::int64_t j0 = block * kBlock, cols = std::min(kBlock, s_len - j0);
    const std::int64_t kv_at = (bi * s_len + j0) * kv_stride + kvh * d;
    float* dkb = dk + kv_at;
    float* dvb = dv + kv_at;
    for (std::int64_t j = 0; j < cols; ++j) {
      std::fill_n(dkb + j * kv_stride, d, 0.0f);
      std::fill_n(dvb + j * kv_stride, d, 0.0f);
    }
    float* p = thread_scratch(scratch, per, slots);
    float* dp = p + kBlock * kBlock;
    // The first query that sees key j0: causal queries see keys up to their own position.
    const std::int64_t first_query = causal ? std::max<std::int64_t>(0, j0 - q_offset) : 0;
    for (std::int64_t h = 0; h < sl.q_heads; ++h) {
      if (kv_head_of(h) != kvh) continue;
      for (std::int64_t i0 = first_query / kBlock * kBlock; i0 < sl.q_len; i0 += kBlock) {
        const std::int64_t rows = std::min(kBlock, sl.q_len - i0);
        const std::int64_t at = (bi * sl.q_len + i0) * q_stride + h * d;
        gemm(rows, cols, d, scale, q + at, q_stride, k + kv_at, kv_stride, /*transpose_b=*/true,
             0.0f, p, cols);
        gemm(rows, cols, d, 1.0f, d_out + at, q_stride, v + kv_at, kv_stride, /*transpose_b=*/true,
             0.0f, dp, cols);
        for (std::int64_t r = 0; r < rows; ++r) {
          const std::int64_t stat = (bi * sl.q_heads + h) * sl.q_len + i0 + r;
          const std::int64_t seen = visible(i0 + r) - j0;  // keys of this block the row sees
          for (std::int64_t j = 0; j < cols; ++j) {
            float& pj = p[r * cols + j];
            pj = j < seen ? std::exp(pj - lse[stat]) : 0.0f;
            dp[r * cols + j] = pj * (dp[r * cols + j] - rowsum[stat]);  // dS
          }
        }
        gemm_transposed_a(cols, d, rows, 1.0f, p, cols, d_out + at, q_stride, 1.0f, dvb, kv_stride);
        gemm_transposed_a(cols, d, rows, scale, dp, cols, q + at, q_stride, 1.0f, dkb, kv_stride);
      }
    }
  });
}

}  // namespace numesh::ops
