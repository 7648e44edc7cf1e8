#include "numesh/ops/kernels/key_block.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "exp_lanes.hpp"

namespace numesh::ops {

namespace {

using runtime::KernelLevel;
using namespace detail;  // exp_lanes.hpp

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------------
// Scalar: the order every width keeps, one lane at a time.

float dot_scalar(const float* q, const float* k, std::int64_t d) {
  float lanes[16] = {};
  for (std::int64_t j = 0; j < d; ++j) lanes[j % 16] = std::fma(q[j], k[j], lanes[j % 16]);
  return fold16(lanes);
}

KeyBlockStats block_scalar(const float* q, const float* const* keys, const float* const* values,
                           std::int64_t count, std::int64_t d, float scale, float* scores,
                           float* o) {
  KeyBlockStats st{kMinusInf, 0.0f};
  for (std::int64_t i = 0; i < count; ++i) {
    scores[i] = dot_scalar(q, keys[i], d) * scale;
    st.max = std::max(st.max, scores[i]);
  }
  st.sum = exp_shifted_sum(scores, count, st.max);
  std::fill(o, o + d, 0.0f);
  for (std::int64_t i = 0; i < count; ++i) {
    for (std::int64_t j = 0; j < d; ++j) o[j] = std::fma(scores[i], values[i][j], o[j]);
  }
  return st;
}

// ---------------------------------------------------------------------------------------------
// AVX2: lanes 0-7 and 8-15 of each 16 in two registers; what is left of a 16 goes lane by lane.

// fold16 of lanes 0-7 in lo and 8-15 in hi, in registers: the same additions in the same order.
__attribute__((target("avx2,fma"))) inline float fold16_256(__m256 lo, __m256 hi) {
  const __m256 t8 = _mm256_add_ps(lo, hi);
  __m128 t = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));  // l + 4
  t = _mm_add_ps(t, _mm_permute_ps(t, _MM_SHUFFLE(3, 2, 3, 2)));                    // l + 2
  t = _mm_add_ps(t, _mm_permute_ps(t, _MM_SHUFFLE(1, 1, 1, 1)));                    // l + 1
  return _mm_cvtss_f32(t);
}

__attribute__((target("avx2,fma"))) float dot_avx2(const float* q, const float* k, std::int64_t d) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  std::int64_t j = 0;
  for (; j + 16 <= d; j += 16) {
    lo = _mm256_fmadd_ps(_mm256_loadu_ps(q + j), _mm256_loadu_ps(k + j), lo);
    hi = _mm256_fmadd_ps(_mm256_loadu_ps(q + j + 8), _mm256_loadu_ps(k + j + 8), hi);
  }
  if (j == d) return fold16_256(lo, hi);
  alignas(32) float lanes[16];
  _mm256_store_ps(lanes, lo);
  _mm256_store_ps(lanes + 8, hi);
  for (std::int64_t l = 0; j < d; ++j, ++l) lanes[l] = std::fma(q[j], k[j], lanes[l]);
  return fold16(lanes);
}

__attribute__((target("avx2,fma"))) KeyBlockStats block_avx2(const float* q,
                                                             const float* const* keys,
                                                             const float* const* values,
                                                             std::int64_t count, std::int64_t d,
                                                             float scale, float* scores, float* o) {
  KeyBlockStats st{kMinusInf, 0.0f};
  for (std::int64_t i = 0; i < count; ++i) {
    scores[i] = dot_avx2(q, keys[i], d) * scale;
    st.max = std::max(st.max, scores[i]);
  }
  st.sum = exp_shifted_sum_avx2(scores, count, st.max);
  std::int64_t j = 0;
  for (; j + 8 <= d; j += 64) {  // up to 8 chunks of 8 outputs a pass, as the AVX-512 kernel
    const std::int64_t chunks = std::min<std::int64_t>(8, (d - j) / 8);
    __m256 acc[8];
    for (auto& a : acc) a = _mm256_setzero_ps();
    for (std::int64_t k = 0; k < count; ++k) {
      const __m256 e = _mm256_set1_ps(scores[k]);
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        if (c < chunks) acc[c] = _mm256_fmadd_ps(e, _mm256_loadu_ps(values[k] + j + 8 * c), acc[c]);
      }
    }
    for (std::int64_t c = 0; c < chunks; ++c) _mm256_storeu_ps(o + j + 8 * c, acc[c]);
    if (chunks < 8) {
      j += 8 * chunks;
      break;
    }
  }
  for (; j < d; ++j) {
    float acc = 0.0f;
    for (std::int64_t k = 0; k < count; ++k) acc = std::fma(scores[k], values[k][j], acc);
    o[j] = acc;
  }
  return st;
}

// ---------------------------------------------------------------------------------------------
// AVX-512: 16 lanes, a masked last chunk (masked-off lanes keep their value: mask3_fmadd).

// fold16 in registers: the same additions in the same order.
__attribute__((target("avx512f"))) inline float fold16_512(__m512 v) {
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(3, 2, 3, 2)));  // l + 8
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 1, 1, 1)));  // l + 4
  v = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(3, 2, 3, 2)));        // l + 2
  v = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(1, 1, 1, 1)));        // l + 1
  return _mm512_cvtss_f32(v);
}

__attribute__((target("avx512f"))) float dot_avx512(const float* q, const float* k,
                                                    std::int64_t d) {
  __m512 acc = _mm512_setzero_ps();
  for (std::int64_t j = 0; j < d; j += 16) {
    const __mmask16 m = first_lanes(d - j);
    acc = _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(m, q + j), _mm512_maskz_loadu_ps(m, k + j),
                                acc, m);
  }
  return fold16_512(acc);
}

__attribute__((target("avx512f"))) KeyBlockStats block_avx512(
    const float* q, const float* const* keys, const float* const* values, std::int64_t count,
    std::int64_t d, float scale, float* scores, float* o) {
  KeyBlockStats st{kMinusInf, 0.0f};
  for (std::int64_t i = 0; i < count; ++i) {
    scores[i] = dot_avx512(q, keys[i], d) * scale;
    st.max = std::max(st.max, scores[i]);
  }
  st.sum = exp_shifted_sum_avx512(scores, count, st.max);
  // Up to 8 chunks of 16 outputs a pass, each key's weight broadcast once for all of them: 8
  // independent fma chains instead of one per pass over the keys.
  for (std::int64_t j0 = 0; j0 < d; j0 += 128) {
    const std::int64_t chunks = std::min<std::int64_t>(8, (d - j0 + 15) / 16);
    __m512 acc[8];
    for (auto& a : acc) a = _mm512_setzero_ps();
    for (std::int64_t i = 0; i < count; ++i) {
      const __m512 e = _mm512_set1_ps(scores[i]);
      const float* v = values[i] + j0;
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        if (c < chunks) {
          acc[c] = _mm512_fmadd_ps(
              e, _mm512_maskz_loadu_ps(first_lanes(d - j0 - 16 * c), v + 16 * c), acc[c]);
        }
      }
    }
    for (std::int64_t c = 0; c < chunks; ++c)
      _mm512_mask_storeu_ps(o + j0 + 16 * c, first_lanes(d - j0 - 16 * c), acc[c]);
  }
  return st;
}

// `heads` queries at once: each key row loaded once for G fma chains, each value row once for
// G sets of output chunks. Every query's chains are the ones block_avx512 runs for it alone
// (an output element's sum runs over the keys in order whatever chunks share a pass), so its
// bits are the same.
template <int G>
__attribute__((target("avx512f"))) void heads_avx512(const float* q, std::int64_t q_stride,
                                                     const float* const* keys,
                                                     const float* const* values, std::int64_t count,
                                                     std::int64_t d, float scale, float* scores,
                                                     float* o, std::int64_t o_stride,
                                                     KeyBlockStats* stats) {
  for (std::int64_t i = 0; i < count; ++i) {
    __m512 acc[G];
    for (auto& a : acc) a = _mm512_setzero_ps();
    const float* k = keys[i];
    for (std::int64_t j = 0; j < d; j += 16) {
      const __mmask16 m = first_lanes(d - j);
      const __m512 kj = _mm512_maskz_loadu_ps(m, k + j);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g)
        acc[g] =
            _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(m, q + g * q_stride + j), kj, acc[g], m);
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) scores[g * count + i] = fold16_512(acc[g]) * scale;
  }
  for (int g = 0; g < G; ++g) {
    KeyBlockStats st{kMinusInf, 0.0f};
    const float* s = scores + g * count;
    for (std::int64_t i = 0; i < count; ++i) st.max = std::max(st.max, s[i]);
    st.sum = exp_shifted_sum_avx512(scores + g * count, count, st.max);
    stats[g] = st;
  }
  constexpr std::int64_t kChunks = G <= 2 ? 8 : 16 / G;  // G x kChunks accumulators
  for (std::int64_t j0 = 0; j0 < d; j0 += 16 * kChunks) {
    const std::int64_t chunks = std::min<std::int64_t>(kChunks, (d - j0 + 15) / 16);
    __m512 acc[G][kChunks];
    for (auto& row : acc)
      for (auto& a : row) a = _mm512_setzero_ps();
    for (std::int64_t i = 0; i < count; ++i) {
      const float* v = values[i] + j0;
      __m512 vc[kChunks];
#pragma GCC unroll 8
      for (int c = 0; c < kChunks; ++c) {
        if (c < chunks) vc[c] = _mm512_maskz_loadu_ps(first_lanes(d - j0 - 16 * c), v + 16 * c);
      }
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) {
        const __m512 e = _mm512_set1_ps(scores[g * count + i]);
#pragma GCC unroll 8
        for (int c = 0; c < kChunks; ++c) {
          if (c < chunks) acc[g][c] = _mm512_fmadd_ps(e, vc[c], acc[g][c]);
        }
      }
    }
    for (int g = 0; g < G; ++g) {
      for (std::int64_t c = 0; c < chunks; ++c)
        _mm512_mask_storeu_ps(o + g * o_stride + j0 + 16 * c, first_lanes(d - j0 - 16 * c),
                              acc[g][c]);
    }
  }
}

}  // namespace

void attend_key_block_heads(const float* q, std::int64_t q_stride, std::int64_t heads,
                            const float* const* keys, const float* const* values,
                            std::int64_t count, std::int64_t d, float scale, float* scores,
                            float* o, std::int64_t o_stride, KeyBlockStats* stats,
                            KernelLevel level) {
  if (avx512(level)) {
    switch (heads) {
      case 1:
        return heads_avx512<1>(q, q_stride, keys, values, count, d, scale, scores, o, o_stride,
                               stats);
      case 2:
        return heads_avx512<2>(q, q_stride, keys, values, count, d, scale, scores, o, o_stride,
                               stats);
      case 3:
        return heads_avx512<3>(q, q_stride, keys, values, count, d, scale, scores, o, o_stride,
                               stats);
      case 4:
        return heads_avx512<4>(q, q_stride, keys, values, count, d, scale, scores, o, o_stride,
                               stats);
      default:
        break;
    }
  }
  // The narrower levels (and any other count) one query at a time: the same bits by definition.
  for (std::int64_t g = 0; g < heads; ++g) {
    stats[g] = attend_key_block(q + g * q_stride, keys, values, count, d, scale, scores + g * count,
                                o + g * o_stride, level);
  }
}

KeyBlockStats attend_key_block(const float* q, const float* const* keys, const float* const* values,
                               std::int64_t count, std::int64_t d, float scale, float* scores,
                               float* o, KernelLevel level) {
  if (avx512(level)) return block_avx512(q, keys, values, count, d, scale, scores, o);
  if (avx2(level)) return block_avx2(q, keys, values, count, d, scale, scores, o);
  return block_scalar(q, keys, values, count, d, scale, scores, o);
}

}  // namespace numesh::ops
