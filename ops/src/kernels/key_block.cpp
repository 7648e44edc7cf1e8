#include "numesh/ops/kernels/key_block.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "exp_lanes.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"

namespace numesh::ops {

namespace {

using runtime::KernelLevel;
using namespace detail;  // exp_lanes.hpp

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

// How the rows of keys and values are stored: fp32, or the 16-bit forms of a KV cache kept in
// half the bytes, each element widened exactly to fp32 as it is loaded (so the arithmetic, and
// the bits, are the fp32 kernel's over the widened rows).
struct F32Rows {
  using Stored = float;
  static float widen(float x) { return x; }
};
struct Bf16Rows {
  using Stored = std::uint16_t;
  static float widen(std::uint16_t x) { return f32_from_bf16(x); }
};
struct F16Rows {
  using Stored = std::uint16_t;
  static float widen(std::uint16_t x) { return f32_from_f16(x); }
};

// ---------------------------------------------------------------------------------------------
// Scalar: the order every width keeps, one lane at a time.

template <class E>
float dot_scalar(const float* q, const typename E::Stored* k, std::int64_t d) {
  float lanes[16] = {};
  for (std::int64_t j = 0; j < d; ++j)
    lanes[j % 16] = std::fma(q[j], E::widen(k[j]), lanes[j % 16]);
  return fold16(lanes);
}

template <class E>
KeyBlockStats block_scalar(const float* q, const typename E::Stored* const* keys,
                           const typename E::Stored* const* values, std::int64_t count,
                           std::int64_t d, float scale, float* scores, float* o) {
  KeyBlockStats st{kMinusInf, 0.0f};
  for (std::int64_t i = 0; i < count; ++i) {
    scores[i] = dot_scalar<E>(q, keys[i], d) * scale;
    st.max = std::max(st.max, scores[i]);
  }
  st.sum = exp_shifted_sum(scores, count, st.max);
  std::fill(o, o + d, 0.0f);
  for (std::int64_t i = 0; i < count; ++i) {
    for (std::int64_t j = 0; j < d; ++j) o[j] = std::fma(scores[i], E::widen(values[i][j]), o[j]);
  }
  return st;
}

// ---------------------------------------------------------------------------------------------
// AVX2: lanes 0-7 and 8-15 of each 16 in two registers; what is left of a 16 goes lane by lane.

// fold16 of lanes 0-7 and 8-15 given as t8 = lo + hi (its first addition, lane l plus lane
// l + 8), in registers: the same additions in the same order.
__attribute__((target("avx2,fma"))) inline float fold16_256(__m256 t8) {
  __m128 t = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));  // l + 4
  t = _mm_add_ps(t, _mm_permute_ps(t, _MM_SHUFFLE(3, 2, 3, 2)));                    // l + 2
  t = _mm_add_ps(t, _mm_permute_ps(t, _MM_SHUFFLE(1, 1, 1, 1)));                    // l + 1
  return _mm_cvtss_f32(t);
}
// fold16 of lanes 0-7 in lo and 8-15 in hi.
__attribute__((target("avx2,fma"))) inline float fold16_256(__m256 lo, __m256 hi) {
  return fold16_256(_mm256_add_ps(lo, hi));
}

// fold16_256 of eight keys' lane sums at once, each given as lo + hi (the first addition of its
// fold, lane l plus lane l + 8), the lanes left as the shuffles leave them: sums 0, 2, 4, 6 in
// the low half and 1, 3, 5, 7 in the high one. The same additions of the same operands as one
// at a time (l + 4, then l + 2 and l + 1; addition commutes exactly), the shuffles shared.
__attribute__((target("avx2,fma"))) inline __m256 fold8x8_256_unordered(const __m256* t8) {
  __m256 u[4], v[2];
  for (int j = 0; j < 4; ++j) {  // halves: key 2j's lanes l < 4 plus l + 4, then key 2j + 1's
    u[j] = _mm256_add_ps(_mm256_permute2f128_ps(t8[2 * j], t8[2 * j + 1], 0x20),
                         _mm256_permute2f128_ps(t8[2 * j], t8[2 * j + 1], 0x31));
  }
  for (int j = 0; j < 2; ++j) {  // lanes 0-1 of each half: l plus l + 2
    v[j] = _mm256_add_ps(_mm256_shuffle_ps(u[2 * j], u[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(u[2 * j], u[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // Lane 0 plus lane 1: keys 0, 2, 4, 6 in the low half, 1, 3, 5, 7 in the high half.
  return _mm256_add_ps(_mm256_shuffle_ps(v[0], v[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm256_shuffle_ps(v[0], v[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// fold8x8_256_unordered in key order: lane i of the result is fold16_256 of key i.
__attribute__((target("avx2,fma"))) inline __m256 fold8x8_256(const __m256* t8) {
  return _mm256_permutevar8x32_ps(fold8x8_256_unordered(t8),
                                  _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Eight stored elements at p, widened.
template <class E>
__attribute__((target("avx2,fma,f16c"))) inline __m256 load8(const typename E::Stored* p) {
  if constexpr (std::is_same_v<E, F32Rows>) {
    return _mm256_loadu_ps(p);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (std::is_same_v<E, Bf16Rows>) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      return _mm256_cvtph_ps(h);
    }
  }
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

// Below, the kernels for heads whose size is a whole number of 16-lane chunks (64 and 128, the
// common ones): no masks and no lane-by-lane tail, and the chunk counts of the output passes
// known at compile time, so that gcc keeps every accumulator in a register. With a run-time
// count and masks it kept the value accumulators on the stack, and the key-block step ran at a
// third of this speed (docs/benchmarks.md, "Session 57").

// The number of 16-float chunks of a head of d floats when the fast kernels take it, else 0.
constexpr std::int64_t kMaxChunks = 8;
inline std::int64_t whole_chunks(std::int64_t d) {
  return d % 16 == 0 && d / 16 <= kMaxChunks ? d / 16 : 0;
}

// Calls f.template operator()<N>() for the N in [1, kMax] that equals n (1 <= n <= kMax).
template <int kMax, int N = 1, class F>
inline void with_count(std::int64_t n, F&& f) {
  if constexpr (N < kMax) {
    if (n != N) return with_count<kMax, N + 1>(n, f);
  }
  f.template operator()<N>();
}

// Scores of G queries against every key, d = 16 C (C = 0: d / 16 at run time): each key row
// loaded once for the G chains of each lane half; the queries' chunks come from L1.
template <int G, int C, class E>
__attribute__((target("avx2,fma,f16c"))) void scores_avx2(const float* q, std::int64_t q_stride,
                                                          const typename E::Stored* const* keys,
                                                          std::int64_t count, std::int64_t d,
                                                          float scale, float* scores) {
  const std::int64_t chunks = C > 0 ? C : d / 16;
  // Eight keys at a time, a query at a time: each key's chains as below, folded together
  // (fold8x8_256), times scale: the same bits.
  const __m256 scales = _mm256_set1_ps(scale);
  std::int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      __m256 t8[8];
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const typename E::Stored* k = keys[i + j];
        __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
#pragma GCC unroll 8
        for (std::int64_t c = 0; c < chunks; ++c) {
          const float* qg = q + g * q_stride + 16 * c;
          lo = _mm256_fmadd_ps(_mm256_loadu_ps(qg), load8<E>(k + 16 * c), lo);
          hi = _mm256_fmadd_ps(_mm256_loadu_ps(qg + 8), load8<E>(k + 16 * c + 8), hi);
        }
        t8[j] = _mm256_add_ps(lo, hi);
      }
      _mm256_storeu_ps(scores + g * count + i, _mm256_mul_ps(fold8x8_256(t8), scales));
    }
  }
  for (; i < count; ++i) {
    const typename E::Stored* k = keys[i];
    __m256 lo[G], hi[G];
    for (int g = 0; g < G; ++g) lo[g] = hi[g] = _mm256_setzero_ps();
#pragma GCC unroll 8
    for (std::int64_t c = 0; c < chunks; ++c) {
      const __m256 k_lo = load8<E>(k + 16 * c), k_hi = load8<E>(k + 16 * c + 8);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) {
        const float* qg = q + g * q_stride + 16 * c;
        lo[g] = _mm256_fmadd_ps(_mm256_loadu_ps(qg), k_lo, lo[g]);
        hi[g] = _mm256_fmadd_ps(_mm256_loadu_ps(qg + 8), k_hi, hi[g]);
      }
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) scores[g * count + i] = fold16_256(lo[g], hi[g]) * scale;
  }
}

// One key's chains against G queries (scores_avx2's, lo + hi) into t8[0, G): the row's chunks
// loaded and widened once for every query, whose chunks come from L1.
template <int G, int C, class E>
__attribute__((target("avx2,fma,f16c"))) inline void key_chains_avx2(const float* q,
                                                                     std::int64_t q_stride,
                                                                     const typename E::Stored* k,
                                                                     __m256* t8) {
  __m256 lo[G], hi[G];
  for (int g = 0; g < G; ++g) lo[g] = hi[g] = _mm256_setzero_ps();
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) {
    const __m256 k_lo = load8<E>(k + 16 * c), k_hi = load8<E>(k + 16 * c + 8);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const float* qg = q + g * q_stride + 16 * c;
      lo[g] = _mm256_fmadd_ps(_mm256_loadu_ps(qg), k_lo, lo[g]);
      hi[g] = _mm256_fmadd_ps(_mm256_loadu_ps(qg + 8), k_hi, hi[g]);
    }
  }
  for (int g = 0; g < G; ++g) t8[g] = _mm256_add_ps(lo[g], hi[g]);
}

// scores_avx2 for G >= 2 queries of a head of whole 16-lane chunks (C of them), each key's row
// loaded (and widened) once for every query: a key a query at a time loaded each row G times,
// and widened a 16-bit row G times, which bound the step. Each (key, query) chain is the one
// scores_avx2 runs, and fold8x8_256 folds any eight of them by the same additions: a fold takes
// 8 / G keys (two for G = 3, two lanes unused), and its lanes go to their queries' rows.
template <int G, int C, class E>
__attribute__((target("avx2,fma,f16c"))) void scores_shared_avx2(
    const float* q, std::int64_t q_stride, const typename E::Stored* const* keys,
    std::int64_t count, float scale, float* scores) {
  static_assert(G >= 2 && G <= 4);
  const __m256 scales = _mm256_set1_ps(scale);
  std::int64_t i = 0;
  if constexpr (G == 4) {
    // Eight keys a round: four folds of two keys each, whose lanes (k0 g0, k0 g2, k1 g0, k1 g2 |
    // k0 g1, k0 g3, k1 g1, k1 g3) become per query pairs (k0, k1), then a 4 x 4 transpose of
    // the pairs gives each query's eight scores in one store.
    const __m256i pairs = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    for (; i + 8 <= count; i += 8) {
      __m256 p[4];
#pragma GCC unroll 4
      for (int f = 0; f < 4; ++f) {
        __m256 t8[8];
        key_chains_avx2<4, C, E>(q, q_stride, keys[i + 2 * f], t8);
        key_chains_avx2<4, C, E>(q, q_stride, keys[i + 2 * f + 1], t8 + 4);
        // (k0 g0, k1 g0, k0 g1, k1 g1 | k0 g2, k1 g2, k0 g3, k1 g3), times scale.
        p[f] = _mm256_mul_ps(_mm256_permutevar8x32_ps(fold8x8_256_unordered(t8), pairs), scales);
      }
      const __m256d x0 = _mm256_unpacklo_pd(_mm256_castps_pd(p[0]), _mm256_castps_pd(p[1]));
      const __m256d x1 = _mm256_unpackhi_pd(_mm256_castps_pd(p[0]), _mm256_castps_pd(p[1]));
      const __m256d x2 = _mm256_unpacklo_pd(_mm256_castps_pd(p[2]), _mm256_castps_pd(p[3]));
      const __m256d x3 = _mm256_unpackhi_pd(_mm256_castps_pd(p[2]), _mm256_castps_pd(p[3]));
      _mm256_storeu_pd(reinterpret_cast<double*>(scores + i), _mm256_permute2f128_pd(x0, x2, 0x20));
      _mm256_storeu_pd(reinterpret_cast<double*>(scores + count + i),
                       _mm256_permute2f128_pd(x1, x3, 0x20));
      _mm256_storeu_pd(reinterpret_cast<double*>(scores + 2 * count + i),
                       _mm256_permute2f128_pd(x0, x2, 0x31));
      _mm256_storeu_pd(reinterpret_cast<double*>(scores + 3 * count + i),
                       _mm256_permute2f128_pd(x1, x3, 0x31));
    }
  } else if constexpr (G == 2) {
    // Four keys a fold: its lanes are query 0's four scores, then query 1's.
    for (; i + 4 <= count; i += 4) {
      __m256 t8[8];
#pragma GCC unroll 4
      for (int kk = 0; kk < 4; ++kk)
        key_chains_avx2<2, C, E>(q, q_stride, keys[i + kk], t8 + 2 * kk);
      const __m256 s = _mm256_mul_ps(fold8x8_256_unordered(t8), scales);
      _mm_storeu_ps(scores + i, _mm256_castps256_ps128(s));
      _mm_storeu_ps(scores + count + i, _mm256_extractf128_ps(s, 1));
    }
  } else {
    // Two keys a fold, in lanes k G + g of fold8x8_256's key order.
    for (; i + 2 <= count; i += 2) {
      __m256 t8[8];
      key_chains_avx2<3, C, E>(q, q_stride, keys[i], t8);
      key_chains_avx2<3, C, E>(q, q_stride, keys[i + 1], t8 + 3);
      t8[6] = t8[7] = _mm256_setzero_ps();
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, _mm256_mul_ps(fold8x8_256(t8), scales));
      for (int g = 0; g < 3; ++g) {
        scores[g * count + i] = lanes[g];
        scores[g * count + i + 1] = lanes[3 + g];
      }
    }
  }
  for (; i < count; ++i) {
    __m256 t8[G];
    key_chains_avx2<G, C, E>(q, q_stride, keys[i], t8);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) scores[g * count + i] = fold16_256(t8[g]) * scale;
  }
}

// o[j0, j0 + 8 N) of one query: N chains of 8 outputs over the keys in order.
template <int N, class E>
__attribute__((target("avx2,fma,f16c"))) void values_pass_avx2(
    const typename E::Stored* const* values, std::int64_t count, std::int64_t j0,
    const float* scores, float* o) {
  __m256 acc[N];
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (std::int64_t i = 0; i < count; ++i) {
    const typename E::Stored* v = values[i] + j0;
    const __m256 e = _mm256_set1_ps(scores[i]);
#pragma GCC unroll 8
    for (int c = 0; c < N; ++c) acc[c] = _mm256_fmadd_ps(e, load8<E>(v + 8 * c), acc[c]);
  }
  for (int c = 0; c < N; ++c) _mm256_storeu_ps(o + j0 + 8 * c, acc[c]);
}

// o[j0, j0 + 8 N) of two queries, their scores s0 and s1: each row's chunks loaded (and widened)
// once for both, and 2 N chains of 8 outputs over the keys in order, each the one
// values_pass_avx2 runs for its query. The `rest` elements of each row past the pass, which a
// later pass reads, are prefetched with it: a pass over part of each row left the rest's lines
// to a second sweep from memory, 1.5x slower than one sweep over whole rows.
template <int N, class E>
__attribute__((target("avx2,fma,f16c"))) void values_pair_avx2(
    const typename E::Stored* const* values, std::int64_t count, std::int64_t j0, const float* s0,
    const float* s1, float* o0, float* o1, std::int64_t rest) {
  constexpr std::int64_t kLine = 64 / sizeof(typename E::Stored);
  __m256 acc0[N], acc1[N];
  for (int c = 0; c < N; ++c) acc0[c] = acc1[c] = _mm256_setzero_ps();
  for (std::int64_t i = 0; i < count; ++i) {
    const typename E::Stored* v = values[i] + j0;
    for (std::int64_t e = 0; e < rest; e += kLine)
      _mm_prefetch(reinterpret_cast<const char*>(v + 8 * N + e), _MM_HINT_T0);
    const __m256 e0 = _mm256_set1_ps(s0[i]), e1 = _mm256_set1_ps(s1[i]);
#pragma GCC unroll 4
    for (int c = 0; c < N; ++c) {
      const __m256 vc = load8<E>(v + 8 * c);
      acc0[c] = _mm256_fmadd_ps(e0, vc, acc0[c]);
      acc1[c] = _mm256_fmadd_ps(e1, vc, acc1[c]);
    }
  }
  for (int c = 0; c < N; ++c) {
    _mm256_storeu_ps(o0 + j0 + 8 * c, acc0[c]);
    _mm256_storeu_ps(o1 + j0 + 8 * c, acc1[c]);
  }
}

// attend_key_block for G queries at once, d a multiple of 16: block_avx2's chains for each query
// (the same bits).
template <int G, class E>
__attribute__((target("avx2,fma,f16c"))) void heads_avx2(
    const float* q, std::int64_t q_stride, const typename E::Stored* const* keys,
    const typename E::Stored* const* values, std::int64_t count, std::int64_t d, float scale,
    float* scores, float* o, std::int64_t o_stride, KeyBlockStats* stats) {
  if (const std::int64_t whole = whole_chunks(d); whole > 0) {
    with_count<kMaxChunks>(whole, [&]<int C>() {
      if constexpr (G >= 2) {
        scores_shared_avx2<G, C, E>(q, q_stride, keys, count, scale, scores);
      } else {
        scores_avx2<G, C, E>(q, q_stride, keys, count, d, scale, scores);
      }
    });
  } else {
    scores_avx2<G, 0, E>(q, q_stride, keys, count, d, scale, scores);
  }
  for (int g = 0; g < G; ++g) {
    float* s = scores + g * count;
    KeyBlockStats st{kMinusInf, 0.0f};
    st.max = block_max_avx2(s, count);
    st.sum = exp_shifted_sum_avx2(s, count, st.max);
    stats[g] = st;
  }
  // The values two queries at a time, 32 outputs a pass: 16 registers hold four chunks of 8 for
  // two queries beside the row's chunk. A query at a time, whole rows of 64 a pass, loaded each
  // row (and widened a 16-bit one) once a query; the first pair's first pass prefetches the
  // rest of each row, which the later passes then find in L2 (without it, a second sweep from
  // memory made the pairs 1.5x slower than single queries at 2000 positions).
  int g = 0;
  for (; g + 2 <= G; g += 2) {
    for (std::int64_t j0 = 0; j0 < d; j0 += 32) {
      const std::int64_t rest = g == 0 && j0 == 0 ? std::max<std::int64_t>(d - 32, 0) : 0;
      with_count<4>(std::min<std::int64_t>(4, (d - j0) / 8), [&]<int N>() {
        values_pair_avx2<N, E>(values, count, j0, scores + g * count, scores + (g + 1) * count,
                               o + g * o_stride, o + (g + 1) * o_stride, rest);
      });
    }
  }
  for (; g < G; ++g) {
    for (std::int64_t j0 = 0; j0 < d; j0 += 64) {
      with_count<8>(std::min<std::int64_t>(8, (d - j0) / 8), [&]<int N>() {
        values_pass_avx2<N, E>(values, count, j0, scores + g * count, o + g * o_stride);
      });
    }
  }
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

// fold16_512 of eight vectors at once: lane 4q of the result is fold16_512(v[q]) and lane 4q + 1
// is fold16_512(v[q + 4]) (q < 4), each by the same additions of the same operands (lane l plus
// lane l + 8, then l + 4, l + 2 and l + 1; addition commutes exactly), the shuffles shared:
// fifteen shuffles and adds for eight sums where one at a time took thirty-two.
__attribute__((target("avx512f"))) inline __m512 fold8x16_512(const __m512* v) {
  __m512 b[4], c[2];
  for (int j = 0; j < 4; ++j) {  // lanes l < 8 of v[2j], then of v[2j + 1]: l plus l + 8
    b[j] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  for (int j = 0; j < 2; ++j) {  // quad q: vector 4j + q's lanes l < 4, plus l + 4
    c[j] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * j], b[2 * j + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(b[2 * j], b[2 * j + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  // Quad q: lanes 0-1 vector q's, 2-3 vector q + 4's, each l plus l + 2.
  const __m512 d = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 2, 3, 2)));
  // Lane 0 plus lane 1 (vector q), lane 2 plus lane 3 (vector q + 4).
  return _mm512_add_ps(_mm512_shuffle_ps(d, d, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(d, d, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Sixteen stored elements at p, widened.
template <class E>
__attribute__((target("avx512f,avx512bw"))) inline __m512 load16(const typename E::Stored* p) {
  if constexpr (std::is_same_v<E, F32Rows>) {
    return _mm512_loadu_ps(p);
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    if constexpr (std::is_same_v<E, Bf16Rows>) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      return _mm512_cvtph_ps(h);
    }
  }
}

// Scores of G queries against every key, d = 16 C: the queries' chunks held in registers, each
// key row loaded once for all of them.
template <int G, int C, class E>
__attribute__((target("avx512f,avx512bw"))) void scores_avx512(
    const float* q, std::int64_t q_stride, const typename E::Stored* const* keys,
    std::int64_t count, float scale, float* scores) {
  __m512 qc[G][C];
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < C; ++c) qc[g][c] = _mm512_loadu_ps(q + g * q_stride + 16 * c);
  }
  // Sixteen keys at a time, a query at a time: each key's chain as below, eight folded together
  // (fold8x16_512), the sixteen put in key order and times scale: the same bits, stored whole
  // (the softmax's 16-lane loads of them then read one store each).
  const __m512i in_order =
      _mm512_set_epi32(29, 25, 21, 17, 28, 24, 20, 16, 13, 9, 5, 1, 12, 8, 4, 0);
  const __m512 scales = _mm512_set1_ps(scale);
  std::int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      __m512 folded[2];
      for (int h = 0; h < 2; ++h) {
        __m512 acc[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
          const typename E::Stored* k = keys[i + 8 * h + j];
          acc[j] = _mm512_setzero_ps();
#pragma GCC unroll 8
          for (int c = 0; c < C; ++c) {
            acc[j] = _mm512_fmadd_ps(qc[g][c], load16<E>(k + 16 * c), acc[j]);
          }
        }
        folded[h] = fold8x16_512(acc);
      }
      const __m512 sums = _mm512_permutex2var_ps(folded[0], in_order, folded[1]);
      _mm512_storeu_ps(scores + g * count + i, _mm512_mul_ps(sums, scales));
    }
  }
  for (; i < count; ++i) {
    const typename E::Stored* k = keys[i];
    __m512 acc[G];
    for (auto& a : acc) a = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      const __m512 kc = load16<E>(k + 16 * c);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) acc[g] = _mm512_fmadd_ps(qc[g][c], kc, acc[g]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) scores[g * count + i] = fold16_512(acc[g]) * scale;
  }
}

// scores_avx512 for four queries (a GQA group of four, the common one), each key's row loaded
// (and widened) once for all four where a key a query at a time loaded it four times: a 16-bit
// row's widening bound the step. The queries' chunks are held in registers up to C = 4 (a head of
// 64) and come from L1 beyond. The (key, query) chains are scores_avx512's, folded eight at a
// time by fold8x16_512 (the same additions whichever they are): two keys a fold, whose quad g
// holds query g's two scores in lanes 0 and 1; a round of eight folds (16 keys) transposes them
// into each query's sixteen scores, stored whole.
// One key's chains against four queries (scores_avx512's) into acc[0, 4): the row's chunks loaded
// and widened once for all four; the queries' chunks from `held` ([4][C], kHeld) or from L1.
template <int C, class E, bool kHeld>
__attribute__((target("avx512f,avx512bw"))) inline void key_chains_avx512(
    const float* q, std::int64_t q_stride, const __m512* held, const typename E::Stored* k,
    __m512* acc) {
  for (int g = 0; g < 4; ++g) acc[g] = _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) {
    const __m512 kc = load16<E>(k + 16 * c);
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      const __m512 qgc = kHeld ? held[g * C + c] : _mm512_loadu_ps(q + g * q_stride + 16 * c);
      acc[g] = _mm512_fmadd_ps(qgc, kc, acc[g]);
    }
  }
}

template <int C, class E>
__attribute__((target("avx512f,avx512bw"))) void scores_shared_avx512(
    const float* q, std::int64_t q_stride, const typename E::Stored* const* keys,
    std::int64_t count, float scale, float* scores) {
  constexpr int G = 4;
  constexpr bool kHeld = C <= 4;  // 16 of the 32 registers
  __m512 qc[kHeld ? G * C : 1];
  if constexpr (kHeld) {
    for (int g = 0; g < G; ++g) {
      for (int c = 0; c < C; ++c) qc[g * C + c] = _mm512_loadu_ps(q + g * q_stride + 16 * c);
    }
  }
  const __m512 scales = _mm512_set1_ps(scale);
  // Quad g of two folds: lanes 0-1 of the first's quad g, then of the second's.
  const __m512i two_folds =
      _mm512_set_epi32(29, 28, 13, 12, 25, 24, 9, 8, 21, 20, 5, 4, 17, 16, 1, 0);
  std::int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    __m512 t[4];
#pragma GCC unroll 4
    for (int m = 0; m < 4; ++m) {
      __m512 folded[2];
      for (int h = 0; h < 2; ++h) {
        __m512 acc[8];
        key_chains_avx512<C, E, kHeld>(q, q_stride, qc, keys[i + 4 * m + 2 * h], acc);
        key_chains_avx512<C, E, kHeld>(q, q_stride, qc, keys[i + 4 * m + 2 * h + 1], acc + 4);
        folded[h] = fold8x16_512(acc);  // lane 4g: key 2h's score for query g, 4g + 1: 2h + 1's
      }
      // Quad g: query g's scores of keys 4m .. 4m + 3.
      t[m] = _mm512_mul_ps(_mm512_permutex2var_ps(folded[0], two_folds, folded[1]), scales);
    }
    // The 4 x 4 transpose of the quads: query g's quads of t[0] .. t[3].
    const __m512 u0 = _mm512_shuffle_f32x4(t[0], t[1], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 u1 = _mm512_shuffle_f32x4(t[2], t[3], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 v0 = _mm512_shuffle_f32x4(t[0], t[1], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512 v1 = _mm512_shuffle_f32x4(t[2], t[3], _MM_SHUFFLE(3, 2, 3, 2));
    _mm512_storeu_ps(scores + i, _mm512_shuffle_f32x4(u0, u1, _MM_SHUFFLE(2, 0, 2, 0)));
    _mm512_storeu_ps(scores + count + i, _mm512_shuffle_f32x4(u0, u1, _MM_SHUFFLE(3, 1, 3, 1)));
    _mm512_storeu_ps(scores + 2 * count + i, _mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(2, 0, 2, 0)));
    _mm512_storeu_ps(scores + 3 * count + i, _mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(3, 1, 3, 1)));
  }
  for (; i < count; ++i) {
    __m512 acc[G];
    key_chains_avx512<C, E, kHeld>(q, q_stride, qc, keys[i], acc);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) scores[g * count + i] = fold16_512(acc[g]) * scale;
  }
}

// The same for any d that is a multiple of 16, the queries' chunks loaded from L1.
template <int G, class E>
__attribute__((target("avx512f,avx512bw"))) void scores_rows_avx512(
    const float* q, std::int64_t q_stride, const typename E::Stored* const* keys,
    std::int64_t count, std::int64_t d, float scale, float* scores) {
  for (std::int64_t i = 0; i < count; ++i) {
    const typename E::Stored* k = keys[i];
    __m512 acc[G];
    for (auto& a : acc) a = _mm512_setzero_ps();
    for (std::int64_t j = 0; j < d; j += 16) {
      const __m512 kj = load16<E>(k + j);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g)
        acc[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * q_stride + j), kj, acc[g]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) scores[g * count + i] = fold16_512(acc[g]) * scale;
  }
}

// The same for any d, the last chunk masked (masked-off lanes keep their value).
template <int G>
__attribute__((target("avx512f"))) void scores_masked_avx512(const float* q, std::int64_t q_stride,
                                                             const float* const* keys,
                                                             std::int64_t count, std::int64_t d,
                                                             float scale, float* scores) {
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
}

// o[j0, j0 + 16 N) of G queries: each value row's N chunks loaded once for every query.
template <int G, int N, class E>
__attribute__((target("avx512f,avx512bw"))) void values_pass_avx512(
    const typename E::Stored* const* values, std::int64_t count, std::int64_t j0,
    const float* scores, float* o, std::int64_t o_stride) {
  __m512 acc[G][N];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  for (std::int64_t i = 0; i < count; ++i) {
    const typename E::Stored* v = values[i] + j0;
    __m512 vc[N];
#pragma GCC unroll 8
    for (int c = 0; c < N; ++c) vc[c] = load16<E>(v + 16 * c);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const __m512 e = _mm512_set1_ps(scores[g * count + i]);
#pragma GCC unroll 8
      for (int c = 0; c < N; ++c) acc[g][c] = _mm512_fmadd_ps(e, vc[c], acc[g][c]);
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < N; ++c) _mm512_storeu_ps(o + g * o_stride + j0 + 16 * c, acc[g][c]);
  }
}

// The same over [j0, d) for any d, up to kChunks chunks, the last masked.
template <int G, int kChunks>
__attribute__((target("avx512f"))) void values_masked_avx512(const float* const* values,
                                                             std::int64_t count, std::int64_t j0,
                                                             std::int64_t d, const float* scores,
                                                             float* o, std::int64_t o_stride) {
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

// attend_key_block for `G` queries at once: each key row loaded once for G fma chains, each
// value row once for G sets of output chunks. Every query's chains are the ones it runs alone
// (an output element's sum runs over the keys in order whatever chunks share a pass), so its
// bits are the same; G = 1 is attend_key_block's kernel at this level. 16-bit rows take only
// heads of whole 16-lane chunks.
template <int G, class E>
__attribute__((target("avx512f,avx512bw"))) void heads_avx512(
    const float* q, std::int64_t q_stride, const typename E::Stored* const* keys,
    const typename E::Stored* const* values, std::int64_t count, std::int64_t d, float scale,
    float* scores, float* o, std::int64_t o_stride, KeyBlockStats* stats) {
  constexpr bool kF32 = std::is_same_v<E, F32Rows>;
  if (const std::int64_t whole = whole_chunks(d); whole > 0) {
    with_count<kMaxChunks>(whole, [&]<int C>() {
      if constexpr (G == 4) {
        scores_shared_avx512<C, E>(q, q_stride, keys, count, scale, scores);
      } else {
        scores_avx512<G, C, E>(q, q_stride, keys, count, scale, scores);
      }
    });
  } else if constexpr (kF32) {
    scores_masked_avx512<G>(q, q_stride, keys, count, d, scale, scores);
  } else {
    scores_rows_avx512<G, E>(q, q_stride, keys, count, d, scale, scores);
  }
  for (int g = 0; g < G; ++g) {
    KeyBlockStats st{kMinusInf, 0.0f};
    st.max = block_max_avx512(scores + g * count, count);
    st.sum = exp_shifted_sum_avx512(scores + g * count, count, st.max);
    stats[g] = st;
  }
  constexpr int kPass = G <= 2 ? 8 : 16 / G;  // G x kPass accumulators
  for (std::int64_t j0 = 0; j0 < d; j0 += 16 * kPass) {
    if constexpr (kF32) {
      if (d % 16 != 0) {
        values_masked_avx512<G, kPass>(values, count, j0, d, scores, o, o_stride);
        continue;
      }
    }
    with_count<kPass>(std::min<std::int64_t>(kPass, (d - j0) / 16), [&]<int N>() {
      values_pass_avx512<G, N, E>(values, count, j0, scores, o, o_stride);
    });
  }
}

// attend_key_block_heads over rows stored as E: the widest kernel the level runs, else one query
// at a time.
template <class E>
void heads_rows(const float* q, std::int64_t q_stride, std::int64_t heads,
                const typename E::Stored* const* keys, const typename E::Stored* const* values,
                std::int64_t count, std::int64_t d, float scale, float* scores, float* o,
                std::int64_t o_stride, KeyBlockStats* stats, KernelLevel level) {
  const bool wide = avx512(level), fast_avx2 = avx2(level) && d % 16 == 0;
  if ((wide || fast_avx2) && heads >= 1 && heads <= kKeyBlockMaxHeads) {
    with_count<kKeyBlockMaxHeads>(heads, [&]<int G>() {
      if (wide) {
        heads_avx512<G, E>(q, q_stride, keys, values, count, d, scale, scores, o, o_stride, stats);
      } else {
        heads_avx2<G, E>(q, q_stride, keys, values, count, d, scale, scores, o, o_stride, stats);
      }
    });
    return;
  }
  // The other cases one query at a time: the same bits by definition.
  for (std::int64_t g = 0; g < heads; ++g) {
    const float* qg = q + g * q_stride;
    float* sg = scores + g * count;
    float* og = o + g * o_stride;
    if (wide || fast_avx2) {
      heads_rows<E>(qg, d, 1, keys, values, count, d, scale, sg, og, d, stats + g, level);
    } else if constexpr (std::is_same_v<E, F32Rows>) {
      stats[g] = avx2(level) ? block_avx2(qg, keys, values, count, d, scale, sg, og)
                             : block_scalar<E>(qg, keys, values, count, d, scale, sg, og);
    } else {
      stats[g] = block_scalar<E>(qg, keys, values, count, d, scale, sg, og);
    }
  }
}

// The 16-bit rows' entry: their dtype checked, then heads_rows.
template <class E>
void heads_16bit(const float* q, std::int64_t q_stride, std::int64_t heads,
                 const std::uint16_t* const* keys, const std::uint16_t* const* values,
                 std::int64_t count, std::int64_t d, float scale, float* scores, float* o,
                 std::int64_t o_stride, KeyBlockStats* stats, KernelLevel level) {
  NUMESH_CHECK(d % 16 == 0, ShapeError,
               "attention: 16-bit keys and values need a head size that is a multiple of 16, "
               "not {}",
               d);
  heads_rows<E>(q, q_stride, heads, keys, values, count, d, scale, scores, o, o_stride, stats,
                level);
}

}  // namespace

void attend_key_block_heads(const float* q, std::int64_t q_stride, std::int64_t heads,
                            const float* const* keys, const float* const* values,
                            std::int64_t count, std::int64_t d, float scale, float* scores,
                            float* o, std::int64_t o_stride, KeyBlockStats* stats,
                            KernelLevel level) {
  heads_rows<F32Rows>(q, q_stride, heads, keys, values, count, d, scale, scores, o, o_stride, stats,
                      level);
}

void attend_key_block_heads(const float* q, std::int64_t q_stride, std::int64_t heads,
                            const std::uint16_t* const* keys, const std::uint16_t* const* values,
                            DType rows, std::int64_t count, std::int64_t d, float scale,
                            float* scores, float* o, std::int64_t o_stride, KeyBlockStats* stats,
                            KernelLevel level) {
  switch (rows) {
    case DType::kBF16:
      return heads_16bit<Bf16Rows>(q, q_stride, heads, keys, values, count, d, scale, scores, o,
                                   o_stride, stats, level);
    case DType::kF16:
      return heads_16bit<F16Rows>(q, q_stride, heads, keys, values, count, d, scale, scores, o,
                                  o_stride, stats, level);
    default:
      throw TypeError(fmt::format("attention: keys and values stored as {}: expected bf16 or f16",
                                  to_string(rows)));
  }
}

KeyBlockStats attend_key_block(const float* q, const float* const* keys, const float* const* values,
                               std::int64_t count, std::int64_t d, float scale, float* scores,
                               float* o, KernelLevel level) {
  KeyBlockStats st;
  heads_rows<F32Rows>(q, d, 1, keys, values, count, d, scale, scores, o, d, &st, level);
  return st;
}

}  // namespace numesh::ops
