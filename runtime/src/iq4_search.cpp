#include "iq4_search.hpp"

#include <immintrin.h>

#include <array>
#include <cstddef>

// GGML's IQ4_NL scale search (iq4_search.hpp). Its 16 fits (the first guess and 15 trial
// scales) each sum 32 products in order; they depend on nothing but x and their own scale. GGML
// runs them one after another, each element's nearest codebook value found by a binary search
// whose branches a CPU cannot predict: quantizing a model to IQ4_NL or IQ4_XS at load spent
// nearly all its time there. From kAvx2 the fits run side by side instead, one a lane: the same
// f32 products and sums in the same order within a lane (this file is compiled with
// -ffp-contract=off, and no sum crosses lanes), the nearest value found by a branch-free binary
// search over the sorted codebook, so the scale is bit for bit the portable one.

namespace numesh::runtime::detail {

namespace {

constexpr std::size_t kRun = 32;
constexpr int kTrials = 7;
constexpr std::size_t kFits = 2 + 2 * kTrials;  // the first guess, then t = -7 .. 7
static_assert(kFits == 16, "one fit a lane of 16");

// kIQ4_NLValues as floats, aligned for a vector load.
struct alignas(64) CodebookFloats {
  float v[16];
};
constexpr CodebookFloats kCodebook = [] {
  CodebookFloats c{};
  for (std::size_t i = 0; i < 16; ++i) c.v[i] = static_cast<float>(kIQ4_NLValues[i]);
  return c;
}();

// The fits' sums: lane f holds sum w v x and sum w v^2 of fit f.
struct Fits {
  alignas(64) float qx[kFits];
  alignas(64) float q2[kFits];
};

// Portable: each fit in turn, the nearest value by iq4_nearest_index (GGML's search).
void fits_portable(const float* x, const float* ids, Fits& out) {
  constexpr const std::array<std::int8_t, 16>& values = kIQ4_NLValues;
  for (std::size_t f = 0; f < kFits; ++f) {
    float qx = 0.0f, q2 = 0.0f;
    for (std::size_t j = 0; j < kRun; ++j) {
      const float weight = x[j] * x[j];
      const auto q =
          static_cast<float>(values[static_cast<std::size_t>(iq4_nearest_index(ids[f] * x[j]))]);
      qx += weight * q * x[j];
      q2 += weight * q * q;
    }
    out.qx[f] = qx;
    out.q2[f] = q2;
  }
}

// AVX2: lanes 0-7 and 8-15 as two vectors. The codebook's value at index i (0 .. 15) is
// picked from its two halves and blended on i > 7.
struct CodebookAvx2 {
  __m256 low, high;
};

__attribute__((target("avx2"))) inline __m256 value_at(const CodebookAvx2& book, __m256i index) {
  const __m256 in_low = _mm256_permutevar8x32_ps(book.low, index);
  const __m256 in_high = _mm256_permutevar8x32_ps(book.high, index);
  const __m256i upper = _mm256_cmpgt_epi32(index, _mm256_set1_epi32(7));
  return _mm256_blendv_ps(in_low, in_high, _mm256_castsi256_ps(upper));
}

// The index of the codebook value nearest v, as iq4_nearest_index picks it: `at` the last index
// whose value is <= v (0 when none is), then the lower of at and at + 1 only when strictly
// nearer; v at or beyond an end, that end; NaN, 15.
__attribute__((target("avx2"))) inline __m256i nearest_index(const CodebookAvx2& book, __m256 v) {
  __m256i at = _mm256_setzero_si256();
  for (int step : {8, 4, 2, 1}) {
    const __m256i candidate = _mm256_add_epi32(at, _mm256_set1_epi32(step));
    const __m256 below_v = _mm256_cmp_ps(value_at(book, candidate), v, _CMP_LE_OQ);
    at = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(at), _mm256_castsi256_ps(candidate), below_v));
  }
  const __m256i fifteen = _mm256_set1_epi32(15);
  const __m256i next = _mm256_min_epi32(_mm256_add_epi32(at, _mm256_set1_epi32(1)), fifteen);
  const __m256 below = value_at(book, at), above = value_at(book, next);
  const __m256 lower = _mm256_cmp_ps(_mm256_sub_ps(v, below), _mm256_sub_ps(above, v), _CMP_LT_OQ);
  __m256 index = _mm256_blendv_ps(_mm256_castsi256_ps(next), _mm256_castsi256_ps(at), lower);
  const __m256 first = _mm256_set1_ps(kIQ4_NLValues[0]), last = _mm256_set1_ps(kIQ4_NLValues[15]);
  index = _mm256_blendv_ps(index, _mm256_setzero_ps(), _mm256_cmp_ps(v, first, _CMP_LE_OQ));
  // At or beyond the last value, or NaN (iq4_nearest_index's binary search ends there too).
  index =
      _mm256_blendv_ps(index, _mm256_castsi256_ps(fifteen), _mm256_cmp_ps(v, last, _CMP_NLT_UQ));
  return _mm256_castps_si256(index);
}

// The codebook value nearest v.
__attribute__((target("avx2"))) inline __m256 nearest(const CodebookAvx2& book, __m256 v) {
  return value_at(book, nearest_index(book, v));
}

__attribute__((target("avx2"))) void fits_avx2(const float* x, const float* ids, Fits& out) {
  const CodebookAvx2 book{_mm256_load_ps(kCodebook.v), _mm256_load_ps(kCodebook.v + 8)};
  const __m256 id_low = _mm256_loadu_ps(ids), id_high = _mm256_loadu_ps(ids + 8);
  __m256 qx_low = _mm256_setzero_ps(), qx_high = qx_low, q2_low = qx_low, q2_high = qx_low;
  for (std::size_t j = 0; j < kRun; ++j) {
    const __m256 xj = _mm256_set1_ps(x[j]);
    const __m256 weight = _mm256_set1_ps(x[j] * x[j]);
    const __m256 q_low = nearest(book, _mm256_mul_ps(id_low, xj));
    const __m256 q_high = nearest(book, _mm256_mul_ps(id_high, xj));
    const __m256 wq_low = _mm256_mul_ps(weight, q_low), wq_high = _mm256_mul_ps(weight, q_high);
    qx_low = _mm256_add_ps(qx_low, _mm256_mul_ps(wq_low, xj));
    qx_high = _mm256_add_ps(qx_high, _mm256_mul_ps(wq_high, xj));
    q2_low = _mm256_add_ps(q2_low, _mm256_mul_ps(wq_low, q_low));
    q2_high = _mm256_add_ps(q2_high, _mm256_mul_ps(wq_high, q_high));
  }
  _mm256_store_ps(out.qx, qx_low);
  _mm256_store_ps(out.qx + 8, qx_high);
  _mm256_store_ps(out.q2, q2_low);
  _mm256_store_ps(out.q2 + 8, q2_high);
}

// AVX-512: the 16 lanes in one vector, the codebook one permute away; as the AVX2 nearest_index.
__attribute__((target("avx512f"))) inline __m512i nearest_index(__m512 codebook, __m512 v) {
  __m512i at = _mm512_setzero_si512();
  for (int step : {8, 4, 2, 1}) {
    const __m512i candidate = _mm512_add_epi32(at, _mm512_set1_epi32(step));
    const __mmask16 below_v =
        _mm512_cmp_ps_mask(_mm512_permutexvar_ps(candidate, codebook), v, _CMP_LE_OQ);
    at = _mm512_mask_mov_epi32(at, below_v, candidate);
  }
  const __m512i fifteen = _mm512_set1_epi32(15);
  const __m512i next = _mm512_min_epi32(_mm512_add_epi32(at, _mm512_set1_epi32(1)), fifteen);
  const __m512 below = _mm512_permutexvar_ps(at, codebook);
  const __m512 above = _mm512_permutexvar_ps(next, codebook);
  const __mmask16 lower =
      _mm512_cmp_ps_mask(_mm512_sub_ps(v, below), _mm512_sub_ps(above, v), _CMP_LT_OQ);
  __m512i index = _mm512_mask_mov_epi32(next, lower, at);
  const __m512 first = _mm512_set1_ps(kIQ4_NLValues[0]), last = _mm512_set1_ps(kIQ4_NLValues[15]);
  index = _mm512_mask_mov_epi32(index, _mm512_cmp_ps_mask(v, first, _CMP_LE_OQ),
                                _mm512_setzero_si512());
  return _mm512_mask_mov_epi32(index, _mm512_cmp_ps_mask(v, last, _CMP_NLT_UQ), fifteen);
}

// The codebook value nearest v.
__attribute__((target("avx512f"))) inline __m512 nearest(__m512 codebook, __m512 v) {
  return _mm512_permutexvar_ps(nearest_index(codebook, v), codebook);
}

__attribute__((target("avx512f"))) void fits_avx512(const float* x, const float* ids, Fits& out) {
  const __m512 codebook = _mm512_load_ps(kCodebook.v);
  const __m512 id = _mm512_loadu_ps(ids);
  __m512 qx = _mm512_setzero_ps(), q2 = qx;
  for (std::size_t j = 0; j < kRun; ++j) {
    const __m512 xj = _mm512_set1_ps(x[j]);
    const __m512 q = nearest(codebook, _mm512_mul_ps(id, xj));
    const __m512 wq = _mm512_mul_ps(_mm512_set1_ps(x[j] * x[j]), q);
    qx = _mm512_add_ps(qx, _mm512_mul_ps(wq, xj));
    q2 = _mm512_add_ps(q2, _mm512_mul_ps(wq, q));
  }
  _mm512_store_ps(out.qx, qx);
  _mm512_store_ps(out.q2, q2);
}

// iq4_pack_nearest at each level.
void pack_portable(const float* x, float id, std::uint8_t* qs) {
  for (std::size_t j = 0; j < kRun / 2; ++j) {
    const int low = iq4_nearest_index(id * x[j]);
    const int high = iq4_nearest_index(id * x[j + kRun / 2]);
    qs[j] = static_cast<std::uint8_t>(low | (high << 4));
  }
}

__attribute__((target("avx2"))) void pack_avx2(const float* x, float id, std::uint8_t* qs) {
  const CodebookAvx2 book{_mm256_load_ps(kCodebook.v), _mm256_load_ps(kCodebook.v + 8)};
  const __m256 scale = _mm256_set1_ps(id);
  for (std::size_t j = 0; j < kRun / 2; j += 8) {
    const __m256i low = nearest_index(book, _mm256_mul_ps(scale, _mm256_loadu_ps(x + j)));
    const __m256i high =
        nearest_index(book, _mm256_mul_ps(scale, _mm256_loadu_ps(x + j + kRun / 2)));
    alignas(32) std::int32_t packed[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(packed),
                       _mm256_or_si256(low, _mm256_slli_epi32(high, 4)));
    for (std::size_t i = 0; i < 8; ++i) qs[j + i] = static_cast<std::uint8_t>(packed[i]);
  }
}

__attribute__((target("avx512f"))) void pack_avx512(const float* x, float id, std::uint8_t* qs) {
  const __m512 codebook = _mm512_load_ps(kCodebook.v);
  const __m512 scale = _mm512_set1_ps(id);
  const __m512i low = nearest_index(codebook, _mm512_mul_ps(scale, _mm512_loadu_ps(x)));
  const __m512i high = nearest_index(codebook, _mm512_mul_ps(scale, _mm512_loadu_ps(x + kRun / 2)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(qs),
                   _mm512_cvtepi32_epi8(_mm512_or_si512(low, _mm512_slli_epi32(high, 4))));
}

}  // namespace

float iq4_search_scale(const float* x, KernelLevel level) noexcept {
  constexpr const std::array<std::int8_t, 16>& values = kIQ4_NLValues;
  const LargestMagnitude largest = first_largest_magnitude(x, kRun);
  if (largest.magnitude < 1e-15f) return 0.0f;
  const float max = largest.value;
  // Each fit's 1 / d. GGML's first guess, -max / values[0]: the extreme at +127, beyond the
  // last value (113); then the trials.
  alignas(64) float ids[kFits];
  const float first = -max / static_cast<float>(values[0]);
  ids[0] = 1.0f / first;
  for (int t = -kTrials; t <= kTrials; ++t)
    ids[static_cast<std::size_t>(1 + t + kTrials)] = static_cast<float>(t + values[0]) / max;
  Fits fits;
  if (level >= KernelLevel::kAvx512) {
    fits_avx512(x, ids, fits);
  } else if (level >= KernelLevel::kAvx2) {
    fits_avx2(x, ids, fits);
  } else {
    fits_portable(x, ids, fits);
  }
  float d = fits.q2[0] > 0.0f ? fits.qx[0] / fits.q2[0] : 0.0f;
  float best = d * fits.qx[0];
  for (std::size_t f = 1; f < kFits; ++f) {
    if (fits.q2[f] > 0.0f && fits.qx[f] * fits.qx[f] > best * fits.q2[f]) {
      d = fits.qx[f] / fits.q2[f];
      best = d * fits.qx[f];
    }
  }
  return d;
}

void iq4_pack_nearest(const float* x, float id, std::uint8_t* qs, KernelLevel level) noexcept {
  if (level >= KernelLevel::kAvx512) {
    pack_avx512(x, id, qs);
  } else if (level >= KernelLevel::kAvx2) {
    pack_avx2(x, id, qs);
  } else {
    pack_portable(x, id, qs);
  }
}

}  // namespace numesh::runtime::detail
