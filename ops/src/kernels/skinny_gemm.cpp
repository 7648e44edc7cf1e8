#include "numesh/ops/kernels/skinny_gemm.hpp"

#include <immintrin.h>

#include <cmath>

namespace numesh::ops {

namespace {

using runtime::KernelLevel;

// Columns [j0, j1) of c from b (stored in-out, an element type), one element at a time: the
// order every level follows.
void columns_scalar(std::int64_t m, std::int64_t j0, std::int64_t j1, std::int64_t k,
                    const float* a, std::int64_t lda, const WeightMatrix& b, float* c,
                    std::int64_t ldc) {
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = j0; j < j1; ++j) {
      float acc = 0.0f;
      for (std::int64_t r = 0; r < k; ++r)
        acc = std::fma(a[i * lda + r], widened_element(b.stored_row(r), b.dtype, j), acc);
      c[i * ldc + j] = acc;
    }
  }
}

// The vector levels stream b a few rows at a time across all the columns they are given (the
// caller picks the columns: device_gemm hands whole rows of large b to one task, so its reads
// are contiguous runs). The accumulators are c's rows themselves (in L1/L2), updated once per
// few rows of b with the products chained in row order, so each element sees the scalar
// kernel's operations.

// ---- AVX-512 ---------------------------------------------------------------------------------

template <DType T>
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512 load16_avx512(const void* b,
                                                                                 std::int64_t at) {
  if constexpr (T == DType::kF32) {
    return _mm512_loadu_ps(static_cast<const float*>(b) + at);
  } else if constexpr (T == DType::kBF16) {
    const __m256i h = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(b) + at));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_cvtph_ps(_mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(b) + at)));
  }
}

// Columns [j0, j0 + width) of c, width a multiple of 16.
template <DType T>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void strip_avx512(
    std::int64_t m, std::int64_t j0, std::int64_t width, std::int64_t k, const float* a,
    std::int64_t lda, const void* b, std::int64_t ldb, float* c, std::int64_t ldc) {
  // 16-bit weights take eight rows per update of c: a byte of them carries twice the
  // accumulator traffic of an fp32 byte (decode_bench, docs/benchmarks.md).
  constexpr int kUnroll = T == DType::kF32 ? 4 : 8;
  // The first group of rows starts from zero rather than from c, so c is never zeroed in memory
  // first (a decode block's partial product, evicted by the weights it streams, cost 3-4 % of a
  // bf16 decode step in zeroing; perf on numesh bench decode).
  std::int64_t r = 0;
  for (; r + kUnroll <= k; r += kUnroll) {
    for (std::int64_t j = j0; j < j0 + width; j += 16) {
      __m512 w[kUnroll];
      for (int u = 0; u < kUnroll; ++u) w[u] = load16_avx512<T>(b, (r + u) * ldb + j);
      for (std::int64_t i = 0; i < m; ++i) {
        const float* x = a + i * lda + r;
        __m512 acc = r == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * ldc + j);
        for (int u = 0; u < kUnroll; ++u) acc = _mm512_fmadd_ps(_mm512_set1_ps(x[u]), w[u], acc);
        _mm512_storeu_ps(c + i * ldc + j, acc);
      }
    }
  }
  if (r == 0) {
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = j0; j < j0 + width; j += 16)
        _mm512_storeu_ps(c + i * ldc + j, _mm512_setzero_ps());
    }
  }
  for (; r < k; ++r) {
    for (std::int64_t j = j0; j < j0 + width; j += 16) {
      const __m512 w = load16_avx512<T>(b, r * ldb + j);
      for (std::int64_t i = 0; i < m; ++i) {
        _mm512_storeu_ps(c + i * ldc + j, _mm512_fmadd_ps(_mm512_set1_ps(a[i * lda + r]), w,
                                                          _mm512_loadu_ps(c + i * ldc + j)));
      }
    }
  }
}

template <DType T>
void skinny_avx512(std::int64_t m, const float* a, std::int64_t lda, const WeightMatrix& w,
                   float* c, std::int64_t ldc) {
  const std::int64_t n = w.cols, k = w.rows;
  const std::int64_t vec_end = n / 16 * 16;
  if (vec_end > 0) strip_avx512<T>(m, 0, vec_end, k, a, lda, w.data, w.stride(), c, ldc);
  columns_scalar(m, vec_end, n, k, a, lda, w, c, ldc);
}

// ---- AVX2 (8 columns a vector) ----------------------------------------------------------------

template <DType T>
__attribute__((target("avx2,fma,f16c"))) inline __m256 load8_avx2(const void* b, std::int64_t at) {
  if constexpr (T == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(b) + at);
  } else if constexpr (T == DType::kBF16) {
    const __m128i h = _mm_loadu_si128(
        reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(b) + at));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_cvtph_ps(_mm_loadu_si128(
        reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(b) + at)));
  }
}

template <DType T>
__attribute__((target("avx2,fma,f16c"))) void strip_avx2(std::int64_t m, std::int64_t j0,
                                                         std::int64_t width, std::int64_t k,
                                                         const float* a, std::int64_t lda,
                                                         const void* b, std::int64_t ldb, float* c,
                                                         std::int64_t ldc) {
  // Four rows per update of c: with 16 vector registers, more weights in flight would spill.
  constexpr int kUnroll = 4;
  std::int64_t r = 0;
  for (; r + kUnroll <= k; r += kUnroll) {
    for (std::int64_t j = j0; j < j0 + width; j += 8) {
      __m256 w[kUnroll];
      for (int u = 0; u < kUnroll; ++u) w[u] = load8_avx2<T>(b, (r + u) * ldb + j);
      for (std::int64_t i = 0; i < m; ++i) {
        const float* x = a + i * lda + r;
        __m256 acc = r == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(c + i * ldc + j);
        for (int u = 0; u < kUnroll; ++u) acc = _mm256_fmadd_ps(_mm256_set1_ps(x[u]), w[u], acc);
        _mm256_storeu_ps(c + i * ldc + j, acc);
      }
    }
  }
  if (r == 0) {
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = j0; j < j0 + width; j += 8)
        _mm256_storeu_ps(c + i * ldc + j, _mm256_setzero_ps());
    }
  }
  for (; r < k; ++r) {
    for (std::int64_t j = j0; j < j0 + width; j += 8) {
      const __m256 w = load8_avx2<T>(b, r * ldb + j);
      for (std::int64_t i = 0; i < m; ++i) {
        _mm256_storeu_ps(c + i * ldc + j, _mm256_fmadd_ps(_mm256_set1_ps(a[i * lda + r]), w,
                                                          _mm256_loadu_ps(c + i * ldc + j)));
      }
    }
  }
}

template <DType T>
void skinny_avx2(std::int64_t m, const float* a, std::int64_t lda, const WeightMatrix& w, float* c,
                 std::int64_t ldc) {
  const std::int64_t n = w.cols, k = w.rows;
  const std::int64_t vec_end = n / 8 * 8;
  if (vec_end > 0) strip_avx2<T>(m, 0, vec_end, k, a, lda, w.data, w.stride(), c, ldc);
  columns_scalar(m, vec_end, n, k, a, lda, w, c, ldc);
}

}  // namespace

void skinny_gemm(std::int64_t m, const float* a, std::int64_t lda, const WeightMatrix& w, float* c,
                 std::int64_t ldc, KernelLevel level) {
  NUMESH_CHECK(w.layout == WeightLayout::kInOut, ShapeError,
               "skinny_gemm: weights stored out-in; it reads in-out ones (dot_gemm reads out-in)");
  const std::int64_t n = w.cols, k = w.rows;
  const DType b_type = w.dtype;
  if (m <= 0 || n <= 0) return;
  const bool avx512 = level >= KernelLevel::kAvx512;
  const bool avx2 = level == KernelLevel::kAvx2;
  // A block format's blocks run along the stored rows, the outputs here: weights of a block
  // format are stored out-in only (dot kernels: block_gemm.hpp).
  NUMESH_CHECK(is_element_dtype(b_type), TypeError,
               "skinny_gemm: {} weights are stored out-in only", to_string(b_type));
  switch (element_type(b_type)) {
    case ElementType::kF32:
      if (avx512) return skinny_avx512<DType::kF32>(m, a, lda, w, c, ldc);
      if (avx2) return skinny_avx2<DType::kF32>(m, a, lda, w, c, ldc);
      break;
    case ElementType::kBF16:
      if (avx512) return skinny_avx512<DType::kBF16>(m, a, lda, w, c, ldc);
      if (avx2) return skinny_avx2<DType::kBF16>(m, a, lda, w, c, ldc);
      break;
    case ElementType::kF16:
      if (avx512) return skinny_avx512<DType::kF16>(m, a, lda, w, c, ldc);
      if (avx2) return skinny_avx2<DType::kF16>(m, a, lda, w, c, ldc);
      break;
  }
  columns_scalar(m, 0, n, k, a, lda, w, c, ldc);
}

}  // namespace numesh::ops
