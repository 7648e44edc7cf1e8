#include "numesh/ops/kernels/block_gemm.hpp"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "block_kernels.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/kernels/blas_gemm.hpp"
#include "numesh/runtime/block_formats.hpp"

namespace numesh::ops {

namespace {

using runtime::KernelLevel;

constexpr std::int64_t kActivationBlock = 32;

// ---- Activations --------------------------------------------------------------------------------

// Every level finds a block's largest magnitude as the largest of its elements' bits without
// the sign (an integer maximum: NaN and infinity compare above every finite value, so the one
// comparison finds them too, and no float max has to agree on NaN), then takes the same f32
// steps.

// What a block's codes are taken with: its scale d and the factor id (see the header).
struct BlockScale {
  float d;
  float id;
  bool finite;  // false: the block holds a NaN or an infinity (scale NaN, codes 0)
};

BlockScale block_scale(std::uint32_t magnitude_bits) {
  if (magnitude_bits >= 0x7F800000u) return {std::numeric_limits<float>::quiet_NaN(), 0.0f, false};
  const float d = std::bit_cast<float>(magnitude_bits) / 127.0f;
  const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
  // 1 / d overflows below amax ~ 3.7e-37: the codes are then 0 (as the runtime's q8_0 quantizer
  // makes them), where x * inf would give inf, and NaN for zeros.
  return {d, std::isfinite(inverse) ? inverse : 0.0f, true};
}

void quantize_block_scalar(const float* x, std::int8_t* q, float* d) {
  std::uint32_t magnitude = 0;
  for (std::int64_t e = 0; e < kActivationBlock; ++e)
    magnitude = std::max(magnitude, std::bit_cast<std::uint32_t>(x[e]) & 0x7FFFFFFFu);
  const BlockScale s = block_scale(magnitude);
  *d = s.d;
  for (std::int64_t e = 0; e < kActivationBlock; ++e) {
    const float code = s.finite ? std::clamp(std::nearbyint(x[e] * s.id), -127.0f, 127.0f) : 0.0f;
    q[e] = static_cast<std::int8_t>(code);
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void quantize_block_avx512(const float* x,
                                                                                std::int8_t* q,
                                                                                float* d) {
  const __m512i no_sign = _mm512_set1_epi32(0x7FFFFFFF);
  const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
  const __m512i magnitude = _mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(x0), no_sign),
                                             _mm512_and_si512(_mm512_castps_si512(x1), no_sign));
  const BlockScale s = block_scale(_mm512_reduce_max_epu32(magnitude));
  *d = s.d;
  if (!s.finite) {
    std::memset(q, 0, kActivationBlock);
    return;
  }
  const __m512 id = _mm512_set1_ps(s.id);
  const __m512i low = _mm512_set1_epi32(-127), high = _mm512_set1_epi32(127);
  // vcvtps2dq rounds to nearest even (MXCSR's default mode, as std::nearbyint's).
  const __m512i c0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, id));
  const __m512i c1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, id));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q),
                   _mm512_cvtepi32_epi8(_mm512_min_epi32(_mm512_max_epi32(c0, low), high)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16),
                   _mm512_cvtepi32_epi8(_mm512_min_epi32(_mm512_max_epi32(c1, low), high)));
}

__attribute__((target("avx2,fma,f16c"))) void quantize_block_avx2(const float* x, std::int8_t* q,
                                                                  float* d) {
  const __m256i no_sign = _mm256_set1_epi32(0x7FFFFFFF);
  __m256 v[4];
  __m256i magnitude = _mm256_setzero_si256();
  for (int p = 0; p < 4; ++p) {
    v[p] = _mm256_loadu_ps(x + 8 * p);
    magnitude = _mm256_max_epu32(magnitude, _mm256_and_si256(_mm256_castps_si256(v[p]), no_sign));
  }
  __m128i m4 =
      _mm_max_epu32(_mm256_castsi256_si128(magnitude), _mm256_extracti128_si256(magnitude, 1));
  m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0x4E));
  m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0xB1));
  const BlockScale s = block_scale(static_cast<std::uint32_t>(_mm_cvtsi128_si32(m4)));
  *d = s.d;
  if (!s.finite) {
    std::memset(q, 0, kActivationBlock);
    return;
  }
  const __m256 id = _mm256_set1_ps(s.id);
  const __m256i low = _mm256_set1_epi32(-127), high = _mm256_set1_epi32(127);
  __m256i c[4];
  for (int p = 0; p < 4; ++p) {
    c[p] =
        _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[p], id)), low), high);
  }
  // The packs work within 128-bit lanes: bytes come out as c0[0..3] c1[0..3] c2[0..3] c3[0..3]
  // | c0[4..7] ..., and the dword permutation puts them back in order.
  const __m256i bytes =
      _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
  _mm256_storeu_si256(
      reinterpret_cast<__m256i*>(q),
      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

// ---- Prefill: dequantized panels and gemm() ----------------------------------------------------

// Panels as gemm_16bit's widened ones (gemm_16bit.cpp: 256 x 4096 suited OpenBLAS's own
// blocking best), 256 inputs being 8 whole blocks.
constexpr std::int64_t kDequantizedPanelInputs = 256;
constexpr std::int64_t kDequantizedPanelOutputs = 4096;
static_assert(whole_blocks_of_every_format(kDequantizedPanelInputs) &&
                  kDequantizedPanelInputs % kActivationBlock == 0,
              "panels start on whole blocks of every format");

// `count` elements (whole blocks) from the block at `from` dequantized into `to`.
void dequantize_run(const unsigned char* from, DType dtype, std::int64_t count, float* to) {
  runtime::block_codec(dtype).dequantize(from,
                                         std::span<float>(to, static_cast<std::size_t>(count)));
}

}  // namespace

void quantize_activations_q8(std::int64_t m, std::int64_t k, const float* a, std::int64_t lda,
                             std::int8_t* codes, float* scales, KernelLevel level) {
  NUMESH_CHECK(k >= 0 && k % kActivationBlock == 0, ShapeError,
               "quantize_activations_q8: k {} is not a whole number of {}-element blocks", k,
               kActivationBlock);
  NUMESH_CHECK(m >= 0 && lda >= k, ShapeError,
               "quantize_activations_q8: m {}, k {} with lda {}: m must be >= 0 and lda >= k", m, k,
               lda);
  const std::int64_t blocks = k / kActivationBlock;
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t t = 0; t < blocks; ++t) {
      const float* x = a + i * lda + t * kActivationBlock;
      std::int8_t* q = codes + i * k + t * kActivationBlock;
      float* d = scales + i * blocks + t;
      switch (level) {
        case KernelLevel::kAvx512:
        case KernelLevel::kAvx512Bf16:
        case KernelLevel::kAmx:
          quantize_block_avx512(x, q, d);
          break;
        case KernelLevel::kAvx2:
          quantize_block_avx2(x, q, d);
          break;
        case KernelLevel::kScalar:
          quantize_block_scalar(x, q, d);
          break;
      }
    }
  }
}

void dot_gemm_blocks(std::int64_t m, const std::int8_t* codes, const float* scales,
                     const WeightMatrix& b, float* c, std::int64_t ldc, KernelLevel level) {
  const detail::BlockKernels* kernels = detail::block_kernels(b.dtype);
  NUMESH_CHECK(kernels != nullptr, TypeError,
               "dot_gemm_blocks: weights of dtype {}; it takes the block formats",
               to_string(b.dtype));
  kernels->dot(m, codes, scales, b, c, ldc, level);
}

void gemm_dequantized(std::int64_t m, const float* a, std::int64_t lda, const WeightMatrix& b,
                      float* c, std::int64_t ldc, KernelLevel /*level*/) {
  NUMESH_CHECK(!is_element_dtype(b.dtype), TypeError,
               "gemm_dequantized: weights of dtype {}; it takes the block formats",
               to_string(b.dtype));
  NUMESH_CHECK(b.layout == WeightLayout::kOutIn, ShapeError,
               "gemm_dequantized: {} weights stored in-out; block-format weights are stored out-in "
               "([n, k])",
               to_string(b.dtype));
  // A reference for tests and benchmarks: it reads rows only.
  NUMESH_CHECK(b.panel_outputs == 0, ShapeError,
               "gemm_dequantized: {} weights stored in panels ({} outputs); it reads rows",
               to_string(b.dtype), b.panel_outputs);
  const std::int64_t n = b.cols, k = b.rows, ldb = b.ld != 0 ? b.ld : k;
  const std::int64_t block = traits(b.dtype).block_elements;
  NUMESH_CHECK(m >= 0 && n >= 0 && k >= 0 && k % block == 0 && ldb >= k && ldb % block == 0 &&
                   lda >= k && ldc >= n,
               ShapeError,
               "gemm_dequantized: m {}, n {}, k {} with lda {}, ldb {}, ldc {}: sizes must be >= "
               "0, k and ldb whole blocks of {} ({}) and each leading dimension at least its "
               "row's length",
               m, n, k, lda, ldb, ldc, block, to_string(b.dtype));
  // The dequantizers read typed blocks (2-byte aligned): every tensor's storage is, and every
  // stored row is an even number of bytes.
  const bool aligned = reinterpret_cast<std::uintptr_t>(b.data) % alignof(runtime::BlockQ8_0) == 0;
  NUMESH_CHECK(aligned, ValueError, "gemm_dequantized: {} weights at an odd address",
               to_string(b.dtype));
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (std::int64_t i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, 0.0f);
    return;
  }
  const auto* w = static_cast<const unsigned char*>(b.data);
  const std::int64_t stride_bytes = b.stride_bytes();
  const std::int64_t block_bytes = traits(b.dtype).block_bytes;
  thread_local std::vector<float> panel;
  const auto need = static_cast<std::size_t>(std::min(n, kDequantizedPanelOutputs) *
                                             std::min(k, kDequantizedPanelInputs));
  if (panel.size() < need) panel.resize(need);
  for (std::int64_t j0 = 0; j0 < n; j0 += kDequantizedPanelOutputs) {
    const std::int64_t cols = std::min(kDequantizedPanelOutputs, n - j0);
    for (std::int64_t r0 = 0; r0 < k; r0 += kDequantizedPanelInputs) {
      const std::int64_t rows = std::min(kDequantizedPanelInputs, k - r0);
      // The panel is [cols, rows]: each output's inputs [r0, r0 + rows), multiplied transposed.
      for (std::int64_t q = 0; q < cols; ++q) {
        dequantize_run(w + (j0 + q) * stride_bytes + r0 / block * block_bytes, b.dtype, rows,
                       panel.data() + q * rows);
      }
      gemm(m, cols, rows, 1.0f, a + r0, lda, panel.data(), rows, /*transpose_b=*/true,
           r0 == 0 ? 0.0f : 1.0f, c + j0, ldc);
    }
  }
}

}  // namespace numesh::ops
