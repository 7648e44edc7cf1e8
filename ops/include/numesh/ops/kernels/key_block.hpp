#pragma once

#include <cstdint>

#include "numesh/core/dtype.hpp"
#include "numesh/runtime/cpu_features.hpp"

// One query against one block of keys: the step of flash-decoding that decode attention and
// paged (ragged) attention repeat for every head, query and block of up to 256 keys, vectorized
// at every kernel level with the same bits at every level. It was Eigen's dot products at the
// portable build's SSE2 width and a scalar std::exp a key: 12 % of a q8_0 decode step at 400
// positions (docs/benchmarks.md, "Session 36").

namespace numesh::ops {

/// A key block's softmax statistics: the largest score and the sum of exp(score - max).
struct KeyBlockStats {
  float max = 0.0f;
  float sum = 0.0f;
};

/// For i < count, with keys[i] and values[i] rows of d floats:
///   scores[i] = (q . keys[i]) * scale, the dot in 16 lanes (element j in lane j mod 16, each
///               lane a chain of fmas in order, folded lane l + 8 into l, then + 4, + 2, + 1);
///   max = the largest score; e_i = exp(scores[i] - max) (exp_rows's), left in scores[i];
///   sum = the e_i in 16 lanes (key i in lane i mod 16), folded as above;
///   o[j] = sum over i, in order, of e_i values[i][j], one fma each (o is overwritten).
/// The same bits at every kernel level. REQUIRES: count >= 1, d >= 1; scores holds count
/// floats and o d floats.
KeyBlockStats attend_key_block(const float* q, const float* const* keys, const float* const* values,
                               std::int64_t count, std::int64_t d, float scale, float* scores,
                               float* o, runtime::KernelLevel level);

/// The most queries attend_key_block_heads takes at once: four queries' accumulators (scores,
/// then four chunks of 16 outputs each) fit AVX-512's registers beside the rows they share.
inline constexpr std::int64_t kKeyBlockMaxHeads = 4;

/// attend_key_block for `heads` queries against the same keys and values (the query heads of
/// one kv head under grouped-query attention), each key and value row read once for all of
/// them: query g is q + g * q_stride, its scores scores + g * count, its output
/// o + g * o_stride, its statistics stats[g]. Each query's results are attend_key_block's bits
/// for that query alone, at every kernel level.
/// REQUIRES: 1 <= heads <= kKeyBlockMaxHeads, count >= 1, d >= 1; scores holds heads * count
/// floats.
void attend_key_block_heads(const float* q, std::int64_t q_stride, std::int64_t heads,
                            const float* const* keys, const float* const* values,
                            std::int64_t count, std::int64_t d, float scale, float* scores,
                            float* o, std::int64_t o_stride, KeyBlockStats* stats,
                            runtime::KernelLevel level);

/// attend_key_block_heads over keys and values stored as 16-bit floats (`rows` kBF16 or kF16
/// bits: a KV cache kept in half the bytes): each element widened exactly to fp32 as it is
/// loaded, then the fp32 kernel's arithmetic, so every result has the bits attend_key_block_heads
/// gives over the widened rows, at every kernel level.
/// Throws: TypeError for another dtype; ShapeError when d is not a multiple of 16.
/// REQUIRES: as attend_key_block_heads.
void attend_key_block_heads(const float* q, std::int64_t q_stride, std::int64_t heads,
                            const std::uint16_t* const* keys, const std::uint16_t* const* values,
                            DType rows, std::int64_t count, std::int64_t d, float scale,
                            float* scores, float* o, std::int64_t o_stride, KeyBlockStats* stats,
                            runtime::KernelLevel level);

}  // namespace numesh::ops
