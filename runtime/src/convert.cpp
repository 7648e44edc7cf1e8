#include "numesh/runtime/convert.hpp"

#include <immintrin.h>

#include <cstddef>

#include "numesh/core/dtype.hpp"

// Each level's loop handles whole vectors and leaves the tail to the scalar conversion, so every
// level writes the same bits. The vector versions are compiled for their instruction set with
// target attributes (the binary may be built for less) and only called when the CPU has it.

namespace numesh::runtime {

namespace {

void f32_to_bf16_scalar(const float* src, std::uint16_t* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = bf16_from_f32(src[i]);
}
void bf16_to_f32_scalar(const std::uint16_t* src, float* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = f32_from_bf16(src[i]);
}
void f32_to_f16_scalar(const float* src, std::uint16_t* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = f16_from_f32(src[i]);
}
void f16_to_f32_scalar(const std::uint16_t* src, float* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = f32_from_f16(src[i]);
}

// ---- AVX2 (+F16C) ------------------------------------------------------------------------------

// Rounds 8 floats to bf16 bits in the low halves of 32-bit lanes: the integer rounding of
// bf16_from_f32, NaN replaced by the canonical quiet NaN with its sign.
__attribute__((target("avx2,fma,f16c"))) __m256i bf16_round_avx2(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i abs = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F800000));
  const __m256i quiet =
      _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x8000)),
                      _mm256_set1_epi32(0x7FC0));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

__attribute__((target("avx2,fma,f16c"))) void f32_to_bf16_avx2(const float* src, std::uint16_t* dst,
                                                               std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i lo = bf16_round_avx2(_mm256_loadu_ps(src + i));
    const __m256i hi = bf16_round_avx2(_mm256_loadu_ps(src + i + 8));
    // packus works per 128-bit half: (lo0, hi0, lo1, hi1); reorder the 64-bit quarters.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), packed);
  }
  f32_to_bf16_scalar(src + i, dst + i, n - i);
}

__attribute__((target("avx2,fma,f16c"))) void bf16_to_f32_avx2(const std::uint16_t* src, float* dst,
                                                               std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
  }
  bf16_to_f32_scalar(src + i, dst + i, n - i);
}

__attribute__((target("avx2,fma,f16c"))) void f32_to_f16_avx2(const float* src, std::uint16_t* dst,
                                                              std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(src + i);
    __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    // vcvtps2ph keeps a NaN's payload; numesh writes the canonical quiet NaN.
    const __m128i nan = _mm_packs_epi32(
        _mm256_castsi256_si128(_mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q))),
        _mm256_extracti128_si256(_mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)), 1));
    const __m128i quiet = _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16(static_cast<short>(0x8000))),
                                       _mm_set1_epi16(0x7E00));
    h = _mm_blendv_epi8(h, quiet, nan);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  f32_to_f16_scalar(src + i, dst + i, n - i);
}

__attribute__((target("avx2,fma,f16c"))) void f16_to_f32_avx2(const std::uint16_t* src, float* dst,
                                                              std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
  f16_to_f32_scalar(src + i, dst + i, n - i);
}

// ---- AVX-512 (F, BW, VL) ---------------------------------------------------------------------
// bf16 rounding stays integer arithmetic even where AVX512_BF16 exists: its vcvtneps2bf16
// treats subnormal inputs as zero, which PyTorch does not.

__attribute__((target("avx512f,avx512bw,avx512vl"))) void f32_to_bf16_avx512(const float* src,
                                                                             std::uint16_t* dst,
                                                                             std::size_t n) {
  std::size_t i = 0;
  const __m512i one = _mm512_set1_epi32(1), round = _mm512_set1_epi32(0x7FFF);
  for (; i + 16 <= n; i += 16) {
    const __m512i bits = _mm512_castps_si512(_mm512_loadu_ps(src + i));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), one);
    __m512i out = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, round)), 16);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(
        _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
    const __m512i quiet =
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x8000)),
                        _mm512_set1_epi32(0x7FC0));
    out = _mm512_mask_blend_epi32(nan, out, quiet);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(out));
  }
  f32_to_bf16_scalar(src + i, dst + i, n - i);
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void bf16_to_f32_avx512(
    const std::uint16_t* src, float* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
  bf16_to_f32_scalar(src + i, dst + i, n - i);
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void f32_to_f16_avx512(const float* src,
                                                                            std::uint16_t* dst,
                                                                            std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(src + i);
    __m256i h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __m256i quiet =
        _mm256_or_si256(_mm256_and_si256(h, _mm256_set1_epi16(static_cast<short>(0x8000))),
                        _mm256_set1_epi16(0x7E00));
    h = _mm256_mask_blend_epi16(nan, h, quiet);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
  }
  f32_to_f16_scalar(src + i, dst + i, n - i);
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void f16_to_f32_avx512(
    const std::uint16_t* src, float* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(
        dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  }
  f16_to_f32_scalar(src + i, dst + i, n - i);
}

bool wide(KernelLevel level) { return level >= KernelLevel::kAvx512; }

}  // namespace

void convert_f32_to_bf16(std::span<const float> src, std::span<std::uint16_t> dst,
                         KernelLevel level) {
  if (wide(level)) return f32_to_bf16_avx512(src.data(), dst.data(), src.size());
  if (level == KernelLevel::kAvx2) return f32_to_bf16_avx2(src.data(), dst.data(), src.size());
  f32_to_bf16_scalar(src.data(), dst.data(), src.size());
}

void convert_bf16_to_f32(std::span<const std::uint16_t> src, std::span<float> dst,
                         KernelLevel level) {
  if (wide(level)) return bf16_to_f32_avx512(src.data(), dst.data(), src.size());
  if (level == KernelLevel::kAvx2) return bf16_to_f32_avx2(src.data(), dst.data(), src.size());
  bf16_to_f32_scalar(src.data(), dst.data(), src.size());
}

void convert_f32_to_f16(std::span<const float> src, std::span<std::uint16_t> dst,
                        KernelLevel level) {
  if (wide(level)) return f32_to_f16_avx512(src.data(), dst.data(), src.size());
  if (level == KernelLevel::kAvx2) return f32_to_f16_avx2(src.data(), dst.data(), src.size());
  f32_to_f16_scalar(src.data(), dst.data(), src.size());
}

void convert_f16_to_f32(std::span<const std::uint16_t> src, std::span<float> dst,
                        KernelLevel level) {
  if (wide(level)) return f16_to_f32_avx512(src.data(), dst.data(), src.size());
  if (level == KernelLevel::kAvx2) return f16_to_f32_avx2(src.data(), dst.data(), src.size());
  f16_to_f32_scalar(src.data(), dst.data(), src.size());
}

}  // namespace numesh::runtime
