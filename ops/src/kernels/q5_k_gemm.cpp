#include <immintrin.h>

#include <cstdint>

#include "block_kernels.hpp"
#include "kquant_minimum_scales.hpp"
#include "numesh/ops/kernels/block_gemm.hpp"
#include "packed_panels.hpp"
#include "q8_dot_common.hpp"

// q5_k's kernels: the shared int8 dot kernel (q8_dot_common.hpp) on GGML's Q5_K super-blocks
// (runtime/block_formats.hpp's BlockQ5_K: Q4_K's d, dmin and 6-bit codes at bytes 0-15, 32
// bytes of fifth bits at 16, Q4_K's 128 bytes of nibbles at 48). Weight e of sub-block j is
// d sc_j q_e - dmin m_j with q_e 0 .. 31: the kernel multiplies q_e as it is (unsigned bytes for
// vpmaddubsw and vpdpbusd, whose pair sums stay within 2 * 31 * 127) and takes the minimums off
// as Q4_K's does. Sub-block j's fifth bits are bit j of the 32 qh bytes (bit 2c + h for element
// 64 c + 32 h + l, in byte l).

namespace numesh::ops {

namespace {

using detail::KquantBlock;
using detail::KquantScales256;
using detail::KquantWeights512;

constexpr std::int64_t kQ5_KHighBits = 16;
constexpr std::int64_t kQ5_KNibbles = 48;

// 176 bytes; one scale per activation block; minimums; unsigned codes at every level.
struct Q5_KCodes : detail::KquantFormat<DType::kQ5_K, 176, 1, true, false, 0> {
  static void decode(const unsigned char* block, KquantBlock& out) {
    detail::kquant_minimum_scales(block, out);
    const unsigned char* high = block + kQ5_KHighBits;
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        const unsigned char byte = block[kQ5_KNibbles + 32 * c + l];
        out.codes[64 * c + l] =
            static_cast<std::int8_t>((byte & 0x0F) | (((high[l] >> (2 * c)) & 1) << 4));
        out.codes[64 * c + 32 + l] =
            static_cast<std::int8_t>((byte >> 4) | (((high[l] >> (2 * c + 1)) & 1) << 4));
      }
    }
  }

  __attribute__((target("avx2,f16c"))) static KquantScales256 scales256(
      const unsigned char* block) {
    return detail::kquant_minimum_scales256(block);
  }

  // Bit kBit of each byte of `v` moved to bit 4 (a 16-bit shift; the mask the callers apply
  // keeps bit 4 alone, whatever the shift moved across the byte boundary).
  template <int kBit>
  __attribute__((target("avx2"))) static __m256i at_bit4_256(__m256i v) {
    if constexpr (kBit <= 4) return _mm256_slli_epi16(v, 4 - kBit);
    return _mm256_srli_epi16(v, kBit - 4);
  }
  template <int kBit>
  NUMESH_Q8DOT_AVX512 static __m512i at_bit4_512(__m512i v) {
    if constexpr (kBit <= 4) return _mm512_slli_epi16(v, 4 - kBit);
    return _mm512_srli_epi16(v, kBit - 4);
  }

  // Sub-block kJ: the nibbles, and 16 where bit kJ of the qh byte is set.
  template <int kJ>
  __attribute__((target("avx2"))) static __m256i codes256(const unsigned char* block) {
    const __m256i high =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kQ5_KHighBits));
    return _mm256_or_si256(detail::kquant_nibbles256<kJ>(block + kQ5_KNibbles),
                           _mm256_and_si256(at_bit4_256<kJ>(high), _mm256_set1_epi8(0x10)));
  }

  // Pair kC (sub-blocks 2 kC and 2 kC + 1 in the low and the high half): the nibbles, and bits
  // 2 kC and 2 kC + 1 of the qh bytes at bit 4.
  template <int kC>
  NUMESH_Q8DOT_AVX512 static __m512i pair512(const unsigned char* block) {
    const __m512i high = _mm512_broadcast_i64x4(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kQ5_KHighBits)));
    const __m512i at4 = _mm512_mask_mov_epi16(at_bit4_512<2 * kC>(high), 0xFFFF0000u,
                                              at_bit4_512<2 * kC + 1>(high));
    return _mm512_or_si512(detail::kquant_nibbles512<kC>(block + kQ5_KNibbles),
                           _mm512_and_si512(at4, _mm512_set1_epi8(0x10)));
  }

  template <bool kVnni, bool kHalf>
  NUMESH_Q8DOT_AVX512 static KquantWeights512 weights512(const unsigned char* block) {
    static_assert(!kHalf, "super-blocks are whole steps");
    return detail::kquant_minimum_weights512<Q5_KCodes>(block);
  }
};

}  // namespace

constinit const detail::BlockKernels detail::kQ5_KBlockKernels =
    detail::block_kernels_of<Q5_KCodes>();

}  // namespace numesh::ops
