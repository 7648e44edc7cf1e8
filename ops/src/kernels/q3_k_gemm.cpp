#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "block_kernels.hpp"
#include "numesh/ops/kernels/block_gemm.hpp"
#include "packed_panels.hpp"
#include "q8_dot_common.hpp"

// q3_k's kernels: the shared int8 dot kernel (q8_dot_common.hpp) on GGML's Q3_K super-blocks
// (runtime/block_formats.hpp's BlockQ3_K: 32 bytes of high bits, 64 of low bit pairs at 32, 12
// bytes of 6-bit scale codes at 96, f16 d at 108). Weight e of sub-block g is d (sc_g - 32)
// (q_e - 4) with a 3-bit q_e: in each half of 128 inputs, byte l of its 32 low-pair bytes holds
// inputs l, l + 32, l + 64 and l + 96 from bit 0 up, and bit t of high-bit byte l is input
// 32 t + l's (t = 0 .. 7 over the whole super-block). So activation block t (32 inputs) is the
// bit pair t mod 4 of its half's 32 bytes and bit t of the 32 high-bit bytes. Q6_K's order and
// steps otherwise (two sub-block scales an activation block, no minimums).

namespace numesh::ops {

namespace {

using detail::KquantBlock;
using detail::KquantScales256;
using detail::KquantWeights512;

constexpr std::int64_t kQ3_KLow = 32;  // bytes: the low bit pairs
constexpr std::int64_t kQ3_KScales = 96;
constexpr std::int64_t kQ3_KScale = 108;
constexpr int kQ3_KOffset = 4;  // the code is q - 4

// Sub-block g's scale sc_g - 32 (-32 .. 31) from the 12 packed bytes: its low 4 bits in the low
// (g < 8) or high nibble of byte g mod 8, its high 2 bits at bits 2 (g / 4) of byte 8 + g mod 4.
int q3_k_scale(const unsigned char* block, int g) {
  const unsigned char* packed = block + kQ3_KScales;
  const int nibble = g < 8 ? packed[g] & 0x0F : packed[g - 8] >> 4;
  return (nibble | (((packed[8 + g % 4] >> (2 * (g / 4))) & 3) << 4)) - 32;
}

// The sixteen as signed bytes in a register, in order: the nibbles of bytes 0-7, low then high,
// and the two high bits of each from the word of bytes 8-11, shifted by 0, 2, 4 and 6 for the
// four groups of four (32-bit shifts: the bits that cross from the next byte are masked off).
__attribute__((target("avx2"))) inline __m128i q3_k_scale_bytes(const unsigned char* block) {
  const __m128i low = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + kQ3_KScales));
  const __m128i nibbles =
      _mm_and_si128(_mm_unpacklo_epi64(low, _mm_srli_epi16(low, 4)), _mm_set1_epi8(0x0F));
  std::uint32_t word;
  std::memcpy(&word, block + kQ3_KScales + 8, sizeof word);
  const __m128i high = _mm_and_si128(
      _mm_srlv_epi32(_mm_set1_epi32(static_cast<int>(word)), _mm_setr_epi32(0, 2, 4, 6)),
      _mm_set1_epi8(0x03));
  return _mm_sub_epi8(_mm_or_si128(nibbles, _mm_slli_epi16(high, 4)), _mm_set1_epi8(32));
}

// 110 bytes; two scales per activation block; no minimums; the dot kernel's steps on q (0 .. 7,
// unsigned) with the 4 taken off once per row at AVX2 and AVX-512 alike; the prefill tile's AVX2
// packer on q - 4.
struct Q3_KCodes : detail::KquantFormat<DType::kQ3_K, 110, 2, false, true, kQ3_KOffset> {
  // Scales d (sc_g - 32): an f16 times a 6-bit integer, exact in f32; codes q - 4 (-4 .. 3).
  static void decode(const unsigned char* block, KquantBlock& out) {
    const float d = f32_from_f16(detail::q8dot_scale_bits(block + kQ3_KScale));
    for (int g = 0; g < 16; ++g) out.scales[g] = d * static_cast<float>(q3_k_scale(block, g));
    for (int e = 0; e < 256; ++e) {
      const int low = (block[kQ3_KLow + 32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3;
      const int high = (block[e % 32] >> (e / 32)) & 1;
      out.codes[e] = static_cast<std::int8_t>(low + 4 * high - kQ3_KOffset);
    }
  }

  __attribute__((target("avx2,f16c"))) static KquantScales256 scales256(
      const unsigned char* block) {
    return detail::kquant_byte_scales256(q3_k_scale_bytes(block),
                                         detail::q8dot_scale_bits(block + kQ3_KScale));
  }

  // Block kJ's codes q as they are (0 .. 7: unsigned256, which the AVX2 dot kernel takes), or
  // q - 4, signed, for the prefill tile's AVX2 packer (codes256): bit pair kJ mod 4 of half
  // kJ / 4's 32 bytes, and bit kJ of the high-bit bytes moved to bit 2 (16-bit shifts: the bits
  // that cross from the neighbouring byte are masked off).
  template <int kJ>
  __attribute__((target("avx2"))) static __m256i unsigned256(const unsigned char* block) {
    constexpr int h = kJ / 4, pair = kJ % 4;
    const __m256i low =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kQ3_KLow + 32 * h));
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block));
    __m256i moved;
    if constexpr (kJ >= 2) {
      moved = _mm256_srli_epi16(bits, kJ - 2);
    } else {
      moved = _mm256_slli_epi16(bits, 2 - kJ);
    }
    return _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi16(low, 2 * pair), _mm256_set1_epi8(0x03)),
        _mm256_and_si256(moved, _mm256_set1_epi8(0x04)));
  }

  template <int kJ>
  __attribute__((target("avx2"))) static __m256i codes256(const unsigned char* block) {
    return _mm256_sub_epi8(unsigned256<kJ>(block), _mm256_set1_epi8(kQ3_KOffset));
  }

  // 32 bytes in both halves of a register.
  NUMESH_Q8DOT_AVX512 static __m512i broadcast512(const unsigned char* at) {
    return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)));
  }

  // Pair kP (activation blocks 2 kP and 2 kP + 1), unsigned codes q (0 .. 7), from its half's 32
  // low-pair bytes in both halves of `low`, shifted per 64-bit lane from bit pair 2 (kP mod 2)
  // (low half) and the next (high half), and the 32 high-bit bytes in both halves of `bits`
  // likewise from bits 2 kP and 2 kP + 1, moved to bit 2 (64-bit shifts: the bits that cross from
  // the neighbouring byte are masked off).
  template <int kP>
  NUMESH_Q8DOT_AVX512 static __m512i pair512(__m512i low, __m512i bits) {
    constexpr long long shift = 4 * (kP % 2), bit = 2 * kP;
    const __m512i pairs = _mm512_srlv_epi64(
        low,
        _mm512_set_epi64(shift + 2, shift + 2, shift + 2, shift + 2, shift, shift, shift, shift));
    const __m512i high = _mm512_and_si512(
        _mm512_srlv_epi64(bits,
                          _mm512_set_epi64(bit + 1, bit + 1, bit + 1, bit + 1, bit, bit, bit, bit)),
        _mm512_set1_epi8(0x01));
    // 0xEC: (a & c) | b, the pair's two low bits and the high bit moved to bit 2.
    return _mm512_ternarylogic_epi32(pairs, _mm512_slli_epi16(high, 2), _mm512_set1_epi8(0x03),
                                     0xEC);
  }

  template <bool kVnni, bool kHalf>
  NUMESH_Q8DOT_AVX512 static KquantWeights512 weights512(const unsigned char* block) {
    static_assert(!kHalf, "super-blocks are whole steps");
    const __m512i bits = broadcast512(block);
    const __m512i first = broadcast512(block + kQ3_KLow);
    const __m512i second = broadcast512(block + kQ3_KLow + 32);
    KquantWeights512 w;
    w.c0 = pair512<0>(first, bits);
    w.c1 = pair512<1>(first, bits);
    w.c2 = pair512<2>(second, bits);
    w.c3 = pair512<3>(second, bits);
    w.scales = detail::kquant_byte_scales512(q3_k_scale_bytes(block),
                                             detail::q8dot_scale_bits(block + kQ3_KScale));
    w.minimums = _mm256_setzero_ps();
    return w;
  }
};

}  // namespace

constinit const detail::BlockKernels detail::kQ3_KBlockKernels =
    detail::block_kernels_of<Q3_KCodes>();

}  // namespace numesh::ops
