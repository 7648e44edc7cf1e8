#include "numesh/ops/kernels/exp_kernels.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "exp_lanes.hpp"

namespace numesh::ops {

namespace {

using runtime::KernelLevel;
using namespace detail;  // exp_lanes.hpp

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
    const auto m = first_lanes(n - i);
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
    const auto m = first_lanes(n - i);
    const __m512 x = _mm512_maskz_loadu_ps(m, g + i);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
    _mm512_mask_storeu_ps(
        g + i, m,
        _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), _mm512_maskz_loadu_ps(m, u + i)));
  }
}

// ---------------------------------------------------------------------------------------------
// softmax_row. The sum of the exponentials is taken in 16 lanes (element i in lane i mod 16),
// folded as fold16 does: the order every width keeps.

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
    const auto k = first_lanes(n - i);
    m = _mm512_mask_max_ps(m, k, m, _mm512_maskz_loadu_ps(k, row + i));
  }
  return _mm512_reduce_max_ps(m);
}

void softmax_scalar(float* row, std::int64_t visible) {
  const float inv = 1.0f / exp_shifted_sum(row, visible, row_max(row, visible));
  for (std::int64_t i = 0; i < visible; ++i) row[i] *= inv;
}

__attribute__((target("avx2,fma"))) void softmax_avx2(float* row, std::int64_t visible) {
  const float s = exp_shifted_sum_avx2(row, visible, row_max_avx2(row, visible));
  const __m256 inv = _mm256_set1_ps(1.0f / s);
  std::int64_t i = 0;
  for (; i + 8 <= visible; i += 8)
    _mm256_storeu_ps(row + i, _mm256_mul_ps(_mm256_loadu_ps(row + i), inv));
  for (; i < visible; ++i) row[i] *= _mm256_cvtss_f32(inv);
}

__attribute__((target("avx512f"))) void softmax_avx512(float* row, std::int64_t visible) {
  const float s = exp_shifted_sum_avx512(row, visible, row_max_avx512(row, visible));
  const __m512 inv = _mm512_set1_ps(1.0f / s);
  for (std::int64_t i = 0; i < visible; i += 16) {
    const __mmask16 k = first_lanes(visible - i);
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
