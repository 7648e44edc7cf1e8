#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "numesh/core/dtype.hpp"
#include "q8_dot_common.hpp"

// PRIVATE to ops/src/kernels: the scales and minimums of the super-block formats with minimums,
// Q4_K and Q5_K (q4_k_gemm.cpp, q5_k_gemm.cpp), which keep them alike: f16 d at byte 0, f16
// dmin at 2, and 12 bytes of 6-bit scale and minimum codes at 4 (GGML's get_scale_min_k4).

namespace numesh::ops::detail {

/// The 12 bytes of 6-bit codes at `packed` unpacked to [sc_0 .. sc_7, m_0 .. m_7] on their three
/// little-endian 32-bit words u0, u1, u2, masks in every byte:
///   sc_0-3 = u0 & 0x3F, sc_4-7 = (u2 & 0x0F) | ((u0 >> 2) & 0x30),
///   m_0-3 = u1 & 0x3F,  m_4-7 = ((u2 >> 4) & 0x0F) | ((u1 >> 2) & 0x30)
/// ((u >> 2) & 0x30 is each byte's top two bits moved to bits 4-5).
inline void kquant_scale_codes(const unsigned char* packed, std::uint8_t* out) {
  std::uint32_t u[3];
  std::memcpy(u, packed, sizeof(u));
  const std::uint32_t words[4] = {
      u[0] & 0x3F3F3F3Fu, (u[2] & 0x0F0F0F0Fu) | ((u[0] >> 2) & 0x30303030u), u[1] & 0x3F3F3F3Fu,
      ((u[2] >> 4) & 0x0F0F0F0Fu) | ((u[1] >> 2) & 0x30303030u)};
  std::memcpy(out, words, sizeof(words));
}

/// The same on one vector: lanes [u0, u2, u1, u2 >> 4] masked, or lanes [-, u0, -, u1] moved.
/// The load takes 16 bytes: the 12 and the 4 after them, in the same block.
__attribute__((target("avx2"))) inline __m128i kquant_scale_codes128(const unsigned char* packed) {
  const __m128i u = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed));
  const __m128i low = _mm_and_si128(
      _mm_srlv_epi32(_mm_shuffle_epi32(u, _MM_SHUFFLE(2, 1, 2, 0)), _mm_setr_epi32(0, 0, 0, 4)),
      _mm_setr_epi32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F));
  const __m128i high =
      _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(u, _MM_SHUFFLE(1, 0, 0, 0)), 2),
                    _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
  return _mm_or_si128(low, high);
}

/// The block's scales d sc_j and negated minimums -(dmin m_j) into out (an f16 times a 6-bit
/// code, exact in f32).
inline void kquant_minimum_scales(const unsigned char* block, KquantBlock& out) {
  std::uint8_t codes[16];
  kquant_scale_codes(block + 4, codes);
  const float d = f32_from_f16(q8dot_scale_bits(block));
  const float dmin = f32_from_f16(q8dot_scale_bits(block + 2));
  for (int j = 0; j < 8; ++j) {
    out.scales[j] = d * static_cast<float>(codes[j]);
    out.minimums[j] = -(dmin * static_cast<float>(codes[8 + j]));
  }
}

/// kquant_minimum_scales at AVX2: the same values, scales in both halves.
__attribute__((target("avx2,f16c"))) inline KquantScales256 kquant_minimum_scales256(
    const unsigned char* block) {
  const __m128i codes = kquant_scale_codes128(block + 4);
  const __m128 d_dmin = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(
      q8dot_scale_bits(block) | (std::uint32_t{q8dot_scale_bits(block + 2)} << 16))));
  const __m256 scales =
      _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(codes)), _mm256_broadcastss_ps(d_dmin));
  const __m256 mins =
      _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(codes, 8))),
                    _mm256_broadcastss_ps(_mm_movehdup_ps(d_dmin)));
  return {scales, scales, _mm256_xor_ps(mins, _mm256_set1_ps(-0.0f))};
}

/// Sub-block kJ's low 4 bits of codes from the 128 nibble bytes at `nibbles` (Q4_K's and Q5_K's
/// layout: the low nibbles of pair kJ / 2's 32 bytes for the even sub-block, the high ones, a
/// 16-bit shift down with the mask dropping the next byte's, for the odd).
template <int kJ>
__attribute__((target("avx2"))) inline __m256i kquant_nibbles256(const unsigned char* nibbles) {
  const __m256i bytes =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(nibbles + 32 * (kJ / 2)));
  return _mm256_and_si256(kJ % 2 == 0 ? bytes : _mm256_srli_epi16(bytes, 4),
                          _mm256_set1_epi8(0x0F));
}

/// Pair kC's low 4 bits of codes: its 32 nibble bytes in both halves of a register, the high
/// half shifted down (sub-blocks 2 kC and 2 kC + 1).
template <int kC>
NUMESH_Q8DOT_AVX512 inline __m512i kquant_nibbles512(const unsigned char* nibbles) {
  const __m512i bytes = _mm512_broadcast_i64x4(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(nibbles + 32 * kC)));
  return _mm512_and_si512(_mm512_mask_srli_epi16(bytes, 0xFFFF0000u, bytes, 4),
                          _mm512_set1_epi8(0x0F));
}

/// The AVX-512 step's weights of a super-block with minimums: F's four pairs of codes
/// (F::pair512), the scales (one an activation block) and the negated minimums.
template <class F>
NUMESH_Q8DOT_AVX512 inline KquantWeights512 kquant_minimum_weights512(const unsigned char* block) {
  const KquantScales256 s = kquant_minimum_scales256(block);
  return {F::template pair512<0>(block), F::template pair512<1>(block),
          F::template pair512<2>(block), F::template pair512<3>(block),
          _mm512_zextps256_ps512(s.low), s.minimums};
}

}  // namespace numesh::ops::detail
