#include "numesh/ops/kernels/exp_kernels.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace numesh::ops {

namespace {

using runtime::KernelLevel;

// Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, ln2 split in two so that n * kLn2Hi is exact;
// exp(r) ~ 1 + r + r^2 P(r); 2^n applied as two halves (n from -150 to 128) so that neither
// factor leaves the normal range and the product under- or overflows as exp does.
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f,
                kP3 = 4.1665795894e-2f, kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;
// Past these, exp is inf or 0 anyway; clamping keeps n's two halves representable.
constexpr float kHi = 89.0f, kLo = -104.0f;

float pow2(std::int32_t n) {  // 2^n for -126 <= n <= 127
  const std::uint32_t bits = static_cast<std::uint32_t>(n + 127) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

float exp1(float x) {
  // min(hi, x) and max(lo, x) as MINPS/MAXPS order them: a NaN x passes through.
  x = kHi < x ? kHi : x;
  x = kLo > x ? kLo : x;
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  const float z = r * r;
  float p = std::fma(kP0, r, kP1);
  p = std::fma(p, r, kP2);
  p = std::fma(p, r, kP3);
  p = std::fma(p, r, kP4);
  p = std::fma(p, r, kP5);
  float y = std::fma(p, z, r);
  y = y + 1.0f;
  if (std::isnan(n)) return y;  // NaN
  const auto ni = static_cast<std::int32_t>(n);
  const std::int32_t half = ni >> 1;  // floor(n / 2), as the vector shifts
  return y * pow2(half) * pow2(ni - half);
}

__attribute__((target("avx2,fma"))) __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(kHi), x);
  x = _mm256_max_ps(_mm256_set1_ps(kLo), x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Hi), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Lo), r);
  const __m256 z = _mm256_mul_ps(r, r);
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(kP0), r, _mm256_set1_ps(kP1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP5));
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

__attribute__((target("avx512f"))) __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(kHi), x);
  x = _mm512_max_ps(_mm512_set1_ps(kLo), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Hi), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Lo), r);
  const __m512 z = _mm512_mul_ps(r, r);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(kP0), r, _mm512_set1_ps(kP1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP5));
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

bool avx512(KernelLevel level) { return level >= KernelLevel::kAvx512; }
bool avx2(KernelLevel level) { return level == KernelLevel::kAvx2; }

// ---------------------------------------------------------------------------------------------
// exp_rows

void exp_scalar(const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = exp1(x[i]);
}

__attribute__((target("avx2,fma"))) void exp_avx2(const float* x, float* y, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp8(_mm256_loadu_ps(x + i)));
  exp_scalar(x + i, y + i, n - i);
}

__attribute__((target("avx512f"))) void exp_avx512(const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; i += 16) {
    const auto m = static_cast<__mmask16>(n - i >= 16 ? 0xffff : (1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m, exp16(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

// ---------------------------------------------------------------------------------------------
// silu_mul_row: g / (1 + exp(-g)) * u. exp(-g) is inf below g = -89 and g / inf = -0.

float silu_mul1(float g, float u) { return g / (1.0f + exp1(-g)) * u; }

__attribute__((target("avx2,fma"))) void silu_avx2(float* g, const float* u, std::int64_t n) {
  std::int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(g + i);
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
    _mm256_storeu_ps(
        g + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) g[i] = silu_mul1(g[i], u[i]);
}

__attribute__((target("avx512f"))) void silu_avx512(float* g, const float* u, std::int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (std::int64_t i = 0; i < n; i += 16) {
    const auto m = static_cast<__mmask16>(n - i >= 16 ? 0xffff : (1u << (n - i)) - 1);
    const __m512 x = _mm512_maskz_loadu_ps(m, g + i);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
    _mm512_mask_storeu_ps(
        g + i, m,
        _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), _mm512_maskz_loadu_ps(m, u + i)));
  }
}

// ---------------------------------------------------------------------------------------------
// softmax_row. The sum of the exponentials is taken in 16 lanes (element i in lane i mod 16),
// folded lane i + 8 into i, then + 4, + 2, + 1: the order every width keeps.

float fold16(const float* lanes) {
  float t[8];
  for (int l = 0; l < 8; ++l) t[l] = lanes[l] + lanes[l + 8];
  for (int l = 0; l < 4; ++l) t[l] = t[l] + t[l + 4];
  for (int l = 0; l < 2; ++l) t[l] = t[l] + t[l + 2];
  return t[0] + t[1];
}

// The maximum is exact in any order (a NaN score makes every output NaN whichever order
// meets it, and +-0 give the same differences), so each width takes its own.
float row_max(const float* row, std::int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (std::int64_t i = 0; i < n; ++i) m = std::max(m, row[i]);
  return m;
}

__attribute__((target("avx2,fma"))) float row_max_avx2(const float* row, std::int64_t n) {
  __m256 m = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(row + i));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float r = row_max(lanes, 8);
  for (; i < n; ++i) r = std::max(r, row[i]);
  return r;
}

__attribute__((target("avx512f"))) float row_max_avx512(const float* row, std::int64_t n) {
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (std::int64_t i = 0; i < n; i += 16) {
    const auto k = static_cast<__mmask16>(n - i >= 16 ? 0xffff : (1u << (n - i)) - 1);
    m = _mm512_mask_max_ps(m, k, m, _mm512_maskz_loadu_ps(k, row + i));
  }
  return _mm512_reduce_max_ps(m);
}

void softmax_scalar(float* row, std::int64_t visible) {
  const float m = row_max(row, visible);
  float lanes[16] = {};
  for (std::int64_t i = 0; i < visible; ++i) {
    row[i] = exp1(row[i] - m);
    lanes[i % 16] += row[i];
  }
  const float inv = 1.0f / fold16(lanes);
  for (std::int64_t i = 0; i < visible; ++i) row[i] *= inv;
}

__attribute__((target("avx2,fma"))) void softmax_avx2(float* row, std::int64_t visible) {
  const float m = row_max_avx2(row, visible);
  const __m256 mv = _mm256_set1_ps(m);
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();  // lanes 0-7 and 8-15
  std::int64_t i = 0;
  for (; i + 16 <= visible; i += 16) {
    const __m256 a = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + i), mv));
    const __m256 b = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + i + 8), mv));
    _mm256_storeu_ps(row + i, a);
    _mm256_storeu_ps(row + i + 8, b);
    lo = _mm256_add_ps(lo, a);
    hi = _mm256_add_ps(hi, b);
  }
  alignas(32) float lanes[16];
  _mm256_store_ps(lanes, lo);
  _mm256_store_ps(lanes + 8, hi);
  for (std::int64_t l = 0; i < visible; ++i, ++l) {
    row[i] = exp1(row[i] - m);
    lanes[l] += row[i];
  }
  const __m256 inv = _mm256_set1_ps(1.0f / fold16(lanes));
  i = 0;
  for (; i + 8 <= visible; i += 8)
    _mm256_storeu_ps(row + i, _mm256_mul_ps(_mm256_loadu_ps(row + i), inv));
  for (; i < visible; ++i) row[i] *= _mm256_cvtss_f32(inv);
}

__attribute__((target("avx512f"))) void softmax_avx512(float* row, std::int64_t visible) {
  const float m = row_max_avx512(row, visible);
  const __m512 mv = _mm512_set1_ps(m);
  __m512 sum = _mm512_setzero_ps();
  for (std::int64_t i = 0; i < visible; i += 16) {
    const auto k = static_cast<__mmask16>(visible - i >= 16 ? 0xffff : (1u << (visible - i)) - 1);
    // Masked-off lanes add 0: a lane's sum is unchanged by it (the sums are positive).
    const __m512 e =
        _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, row + i), mv)));
    _mm512_mask_storeu_ps(row + i, k, e);
    sum = _mm512_add_ps(sum, e);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  const __m512 inv = _mm512_set1_ps(1.0f / fold16(lanes));
  for (std::int64_t i = 0; i < visible; i += 16) {
    const auto k = static_cast<__mmask16>(visible - i >= 16 ? 0xffff : (1u << (visible - i)) - 1);
    _mm512_mask_storeu_ps(row + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, row + i), inv));
  }
}

}  // namespace

void exp_rows(const float* x, float* y, std::int64_t n, KernelLevel level) {
  if (avx512(level)) return exp_avx512(x, y, n);
  if (avx2(level)) return exp_avx2(x, y, n);
  exp_scalar(x, y, n);
}

void silu_mul_row(float* gate, const float* up, std::int64_t n, KernelLevel level) {
  if (avx512(level)) return silu_avx512(gate, up, n);
  if (avx2(level)) return silu_avx2(gate, up, n);
  for (std::int64_t i = 0; i < n; ++i) gate[i] = silu_mul1(gate[i], up[i]);
}

void softmax_row(float* row, std::int64_t visible, std::int64_t width, KernelLevel level) {
  if (avx512(level)) {
    softmax_avx512(row, visible);
  } else if (avx2(level)) {
    softmax_avx2(row, visible);
  } else {
    softmax_scalar(row, visible);
  }
  std::fill(row + visible, row + width, 0.0f);
}

}  // namespace numesh::ops
