#pragma once

// PRIVATE to ops/src/kernels: the pieces of the exponential-based kernels (exp_kernels.cpp,
// key_block.cpp) that must give the same bits at every width: exp over one float, 8 and 16
// lanes, the fixed fold of 16 lane sums, and the shifted exponentials with their sum.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "numesh/runtime/cpu_features.hpp"

namespace numesh::ops::detail {

// Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, ln2 split in two so that n * kExpLn2Hi is exact;
// exp(r) ~ 1 + r + r^2 P(r); 2^n applied as two halves (n from -150 to 128) so that neither
// factor leaves the normal range and the product under- or overflows as exp does.
constexpr float kExpLog2e = 1.44269504088896341f;
constexpr float kExpLn2Hi = 0.693359375f;
constexpr float kExpLn2Lo = -2.12194440e-4f;
constexpr float kExpP0 = 1.9875691500e-4f, kExpP1 = 1.3981999507e-3f, kExpP2 = 8.3334519073e-3f,
                kExpP3 = 4.1665795894e-2f, kExpP4 = 1.6666665459e-1f, kExpP5 = 5.0000001201e-1f;
// Past these, exp is inf or 0 anyway; clamping keeps n's two halves representable.
constexpr float kExpHi = 89.0f, kExpLo = -104.0f;

inline float pow2(std::int32_t n) {  // 2^n for -126 <= n <= 127
  const std::uint32_t bits = static_cast<std::uint32_t>(n + 127) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline float exp1(float x) {
  // min(hi, x) and max(lo, x) as MINPS/MAXPS order them: a NaN x passes through.
  x = kExpHi < x ? kExpHi : x;
  x = kExpLo > x ? kExpLo : x;
  const float n = std::nearbyint(x * kExpLog2e);
  float r = std::fma(n, -kExpLn2Hi, x);
  r = std::fma(n, -kExpLn2Lo, r);
  const float z = r * r;
  float p = std::fma(kExpP0, r, kExpP1);
  p = std::fma(p, r, kExpP2);
  p = std::fma(p, r, kExpP3);
  p = std::fma(p, r, kExpP4);
  p = std::fma(p, r, kExpP5);
  float y = std::fma(p, z, r);
  y = y + 1.0f;
  if (std::isnan(n)) return y;  // NaN
  const auto ni = static_cast<std::int32_t>(n);
  const std::int32_t half = ni >> 1;  // floor(n / 2), as the vector shifts
  return y * pow2(half) * pow2(ni - half);
}

__attribute__((target("avx2,fma"))) inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(kExpHi), x);
  x = _mm256_max_ps(_mm256_set1_ps(kExpLo), x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kExpLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kExpLn2Hi), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kExpLn2Lo), r);
  const __m256 z = _mm256_mul_ps(r, r);
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(kExpP0), r, _mm256_set1_ps(kExpP1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP5));
  __m256 y = _mm256_fmadd_ps(p, z, r);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  const __m256i ni = _mm256_cvtps_epi32(n);  // exact: n is whole (NaN lanes: y is NaN)
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(y, s1), s2);
}

__attribute__((target("avx512f"))) inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(kExpHi), x);
  x = _mm512_max_ps(_mm512_set1_ps(kExpLo), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kExpLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kExpLn2Hi), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kExpLn2Lo), r);
  const __m512 z = _mm512_mul_ps(r, r);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(kExpP0), r, _mm512_set1_ps(kExpP1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP5));
  __m512 y = _mm512_fmadd_ps(p, z, r);
  y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
  const __m512i ni = _mm512_cvtps_epi32(n);
  const __m512i half = _mm512_srai_epi32(ni, 1);
  const __m512i bias = _mm512_set1_epi32(127);
  const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(half, bias), 23));
  const __m512 s2 = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(ni, half), bias), 23));
  return _mm512_mul_ps(_mm512_mul_ps(y, s1), s2);
}

inline bool avx512(runtime::KernelLevel level) { return level >= runtime::KernelLevel::kAvx512; }
inline bool avx2(runtime::KernelLevel level) { return level == runtime::KernelLevel::kAvx2; }

// The sum of 16 lanes in the order every width keeps: lane l + 8 into l, then + 4, + 2, + 1.
inline float fold16(const float* lanes) {
  float t[8];
  for (int l = 0; l < 8; ++l) t[l] = lanes[l] + lanes[l + 8];
  for (int l = 0; l < 4; ++l) t[l] = t[l] + t[l + 4];
  for (int l = 0; l < 2; ++l) t[l] = t[l] + t[l + 2];
  return t[0] + t[1];
}

// The first min(n, 16) lanes (n >= 1): the mask of a chunk of 16 with n elements left.
__attribute__((target("avx512f"))) inline __mmask16 first_lanes(std::int64_t n) {
  return static_cast<__mmask16>(n >= 16 ? 0xffff : (1u << n) - 1);
}

// The largest of x[0, n) (n >= 1) as std::max(m, x[i]) from m = -inf keeps it, 8 or 16 lanes at
// a time: vmaxps(x, m) takes m when x is NaN or equal, as std::max does, so a NaN is never taken
// and the value is the scalar loop's (a zero's sign aside: the loop keeps the first of +0 and -0,
// the lanes may keep the other, and exp(s - m) is the same for either).
__attribute__((target("avx2"))) inline float block_max_avx2(const float* x, std::int64_t n) {
  __m256 m = _mm256_set1_ps(-INFINITY);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float r = lanes[0];
  for (int l = 1; l < 8; ++l) r = std::max(r, lanes[l]);
  for (; i < n; ++i) r = std::max(r, x[i]);
  return r;
}

__attribute__((target("avx512f"))) inline float block_max_avx512(const float* x, std::int64_t n) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  for (std::int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = first_lanes(n - i);
    m = _mm512_mask_max_ps(m, k, _mm512_maskz_loadu_ps(k, x + i), m);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, m);
  float r = lanes[0];
  for (int l = 1; l < 16; ++l) r = std::max(r, lanes[l]);
  return r;
}

// x[i] = exp(x[i] - m) for i < n in place, and their sum: element i in lane i mod 16, each lane
// added in order from 0, folded by fold16. The softmax's and the key block's step, one form a
// width with the same bits.
inline float exp_shifted_sum(float* x, std::int64_t n, float m) {
  float lanes[16] = {};
  for (std::int64_t i = 0; i < n; ++i) {
    x[i] = exp1(x[i] - m);
    lanes[i % 16] += x[i];
  }
  return fold16(lanes);
}

__attribute__((target("avx2,fma"))) inline float exp_shifted_sum_avx2(float* x, std::int64_t n,
                                                                      float m) {
  const __m256 mv = _mm256_set1_ps(m);
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();  // lanes 0-7 and 8-15
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
    const __m256 b = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), mv));
    _mm256_storeu_ps(x + i, a);
    _mm256_storeu_ps(x + i + 8, b);
    lo = _mm256_add_ps(lo, a);
    hi = _mm256_add_ps(hi, b);
  }
  alignas(32) float lanes[16];
  _mm256_store_ps(lanes, lo);
  _mm256_store_ps(lanes + 8, hi);
  for (std::int64_t l = 0; i < n; ++i, ++l) {
    x[i] = exp1(x[i] - m);
    lanes[l] += x[i];
  }
  return fold16(lanes);
}

__attribute__((target("avx512f"))) inline float exp_shifted_sum_avx512(float* x, std::int64_t n,
                                                                       float m) {
  const __m512 mv = _mm512_set1_ps(m);
  __m512 sum = _mm512_setzero_ps();
  for (std::int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = first_lanes(n - i);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), mv));
    _mm512_mask_storeu_ps(x + i, k, e);
    sum = _mm512_mask_add_ps(sum, k, sum, e);  // masked-off lanes keep their sums
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  return fold16(lanes);
}

}  // namespace numesh::ops::detail
