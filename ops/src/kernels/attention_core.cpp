#include "numesh/ops/kernels/attention_core.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <limits>

#include "numesh/ops/kernels/gemm.hpp"
#include "numesh/ops/kernels/rope.hpp"
#include "numesh/ops/tensor.hpp"

namespace numesh::ops {

namespace {

// Queries per GEMM block in the blocked path, and the query count from which it is used.
constexpr std::int64_t kQueryBlock = 64;
constexpr std::int64_t kBlockedFrom = 16;

// The stable softmax of row[0, visible), zeros in [visible, row.size()).
void softmax_prefix(float* row, std::int64_t visible, std::int64_t width) {
  float max_score = -std::numeric_limits<float>::infinity();
  for (std::int64_t i = 0; i < visible; ++i) max_score = std::max(max_score, row[i]);
  float sum = 0.0f;
  for (std::int64_t i = 0; i < visible; ++i) {
    row[i] = std::exp(row[i] - max_score);
    sum += row[i];
  }
  const float inv = 1.0f / sum;
  for (std::int64_t i = 0; i < visible; ++i) row[i] *= inv;
  std::fill(row + visible, row + width, 0.0f);
}

// One query at a time: dot products against each visible key (decode).
void attention_rows(const float* q, const KvView& kv, float* out, const AttentionSlice& sl, std::int64_t d,
                    std::int64_t q_offset, bool causal, float* scores) {
  using Vec = Eigen::Map<const Eigen::VectorXf>;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (std::int64_t bi = 0; bi < sl.batch; ++bi) {
    for (std::int64_t h = 0; h < sl.q_heads; ++h) {
      const std::int64_t kvh = (sl.q_head_offset + h) / sl.group - sl.kv_head_offset;
      const float* kb = kv.k + bi * kv.batch_stride + kvh * kv.head_stride;
      const float* vb = kv.v + bi * kv.batch_stride + kvh * kv.head_stride;
      for (std::int64_t ti = 0; ti < sl.q_len; ++ti) {
        const Vec qr(q + ((bi * sl.q_len + ti) * sl.q_heads + h) * d, d);
        const std::int64_t visible = causal ? q_offset + ti + 1 : sl.kv_len;
        for (std::int64_t si = 0; si < visible; ++si) scores[si] = qr.dot(Vec(kb + si * kv.pos_stride, d)) * scale;
        softmax_prefix(scores, visible, visible);
        Eigen::Map<Eigen::VectorXf> orow(out + ((bi * sl.q_len + ti) * sl.q_heads + h) * d, d);
        orow.setZero();
        for (std::int64_t si = 0; si < visible; ++si) orow += scores[si] * Vec(vb + si * kv.pos_stride, d);
      }
    }
  }
}

// Blocks of queries as GEMMs against contiguous key and value panels (prefill).
void attention_blocked(const float* q, const KvView& kv, float* out, const AttentionSlice& sl, std::int64_t d,
                       std::int64_t q_offset, bool causal, std::span<float> scratch) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const std::int64_t s_len = sl.kv_len;
  float* k_panel = scratch.data();                       // [kv_len, d]
  float* v_panel = k_panel + s_len * d;                  // [kv_len, d]
  float* q_block = v_panel + s_len * d;                  // [block, d]
  float* o_block = q_block + kQueryBlock * d;            // [block, d]
  float* scores = o_block + kQueryBlock * d;             // [block, kv_len]
  for (std::int64_t bi = 0; bi < sl.batch; ++bi) {
    std::int64_t panel_head = -1;
    for (std::int64_t h = 0; h < sl.q_heads; ++h) {
      const std::int64_t kvh = (sl.q_head_offset + h) / sl.group - sl.kv_head_offset;
      if (kvh != panel_head) {  // query heads of one GQA group share the panels
        for (std::int64_t si = 0; si < s_len; ++si) {
          const std::int64_t at = bi * kv.batch_stride + si * kv.pos_stride + kvh * kv.head_stride;
          std::copy_n(kv.k + at, d, k_panel + si * d);
          std::copy_n(kv.v + at, d, v_panel + si * d);
        }
        panel_head = kvh;
      }
      for (std::int64_t i0 = 0; i0 < sl.q_len; i0 += kQueryBlock) {
        const std::int64_t rows = std::min(kQueryBlock, sl.q_len - i0);
        // Keys any query of the block may see: the causal mask hides the rest.
        const std::int64_t width = causal ? std::min(s_len, q_offset + i0 + rows) : s_len;
        for (std::int64_t r = 0; r < rows; ++r) {
          std::copy_n(q + ((bi * sl.q_len + i0 + r) * sl.q_heads + h) * d, d, q_block + r * d);
        }
        MatrixMap sc(scores, rows, width);
        gemm(ConstMatrixMap(q_block, rows, d), ConstMatrixMap(k_panel, width, d), sc, scale, 0.0f,
             /*transpose_b=*/true);
        for (std::int64_t r = 0; r < rows; ++r) {
          softmax_prefix(scores + r * width, causal ? q_offset + i0 + r + 1 : s_len, width);
        }
        gemm(ConstMatrixMap(scores, rows, width), ConstMatrixMap(v_panel, width, d), MatrixMap(o_block, rows, d));
        for (std::int64_t r = 0; r < rows; ++r) {
          std::copy_n(o_block + r * d, d, out + ((bi * sl.q_len + i0 + r) * sl.q_heads + h) * d);
        }
      }
    }
  }
}

}  // namespace

std::int64_t attention_scratch_floats(std::int64_t q_len, std::int64_t kv_capacity, std::int64_t head_dim) noexcept {
  if (q_len < kBlockedFrom) return kv_capacity;
  return 2 * kv_capacity * head_dim + 2 * kQueryBlock * head_dim + kQueryBlock * kv_capacity;
}

void attention_core(const float* q, const KvView& kv, float* out, const AttentionSlice& sl, std::int64_t d,
                    std::int64_t q_offset, bool causal, std::span<float> scratch) {
  if (sl.q_len < kBlockedFrom) {
    attention_rows(q, kv, out, sl, d, q_offset, causal, scratch.data());
  } else {
    attention_blocked(q, kv, out, sl, d, q_offset, causal, scratch);
  }
}

void attention_kernel(float* q, float* k, const float* v, float* out, const AttentionSlice& sl,
                      const AttentionConfig& config, std::span<float> scratch) {
  const std::int64_t d = config.head_dim;
  if (config.rope_theta > 0.0f) {
    rope_inplace(q, sl.batch, sl.q_len, sl.q_heads, d, config.q_offset, config.rope_theta);
    rope_inplace(k, sl.batch, sl.kv_len, sl.kv_heads, d, 0, config.rope_theta);
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
