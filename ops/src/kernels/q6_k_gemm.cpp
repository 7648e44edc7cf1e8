#include <immintrin.h>

#include <cstdint>

#include "block_kernels.hpp"
#include "numesh/ops/kernels/block_gemm.hpp"
#include "packed_panels.hpp"
#include "q8_dot_common.hpp"

// q6_k's kernels: the shared int8 dot kernel (q8_dot_common.hpp) on GGML's Q6_K super-blocks
// (runtime/block_formats.hpp's BlockQ6_K: 128 bytes of low nibbles, 64 of high bit pairs, 16
// int8 sub-block scales at 192, f16 d at 208). Weight e of sub-block g is d sc_g (q_e - 32) with
// a 6-bit q_e: in each half of 128 inputs, byte l of its 64 low-nibble bytes holds inputs l (low
// nibble) and l + 64 (high), byte l + 32 inputs l + 32 and l + 96, and byte l of its 32 high-bit
// bytes the top two bits of l, l + 32, l + 64 and l + 96 from bit 0 up. So a pair of activation
// blocks (64 inputs) is one half's 64 low-nibble bytes, low or high nibbles, and its 32 high-bit
// bytes twice.

namespace numesh::ops {

namespace {

using detail::KquantBlock;
using detail::KquantScales256;
using detail::KquantWeights512;

constexpr std::int64_t kQ6_KHigh = 128;  // bytes: the high bit pairs
constexpr std::int64_t kQ6_KScales = 192;
constexpr std::int64_t kQ6_KScale = 208;
constexpr int kQ6_KOffset = 32;  // the code is q - 32

// 210 bytes; two scales per activation block; no minimums; the dot kernel's steps on q (0 .. 63,
// unsigned) with the 32 taken off once per row at AVX2 and AVX-512 alike; the prefill tile's AVX2
// packer on q - 32.
struct Q6_KCodes : detail::KquantFormat<DType::kQ6_K, 210, 2, false, true, kQ6_KOffset> {
  // Scales d sc_g: an f16 times an int8, exact in f32; codes q - 32 (-32 .. 31).
  static void decode(const unsigned char* block, KquantBlock& out) {
    const float d = f32_from_f16(detail::q8dot_scale_bits(block + kQ6_KScale));
    for (int g = 0; g < 16; ++g) {
      out.scales[g] = d * static_cast<float>(static_cast<std::int8_t>(block[kQ6_KScales + g]));
    }
    for (int h = 0; h < 2; ++h) {
      const unsigned char* low = block + 64 * h;
      std::int8_t* q = out.codes + 128 * h;
      for (int l = 0; l < 32; ++l) {
        const int high = block[kQ6_KHigh + 32 * h + l];
        q[l] = static_cast<std::int8_t>(((low[l] & 0x0F) | ((high & 3) << 4)) - kQ6_KOffset);
        q[l + 32] =
            static_cast<std::int8_t>(((low[l + 32] & 0x0F) | ((high >> 2 & 3) << 4)) - kQ6_KOffset);
        q[l + 64] =
            static_cast<std::int8_t>(((low[l] >> 4) | ((high >> 4 & 3) << 4)) - kQ6_KOffset);
        q[l + 96] =
            static_cast<std::int8_t>(((low[l + 32] >> 4) | ((high >> 6) << 4)) - kQ6_KOffset);
      }
    }
  }

  __attribute__((target("avx2,f16c"))) static KquantScales256 scales256(
      const unsigned char* block) {
    return detail::kquant_byte_scales256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kQ6_KScales)),
        detail::q8dot_scale_bits(block + kQ6_KScale));
  }

  // Block kJ's codes q as they are (unsigned256, which the AVX2 dot kernel takes: kOffset256),
  // or q - 32, signed, for the prefill tile's AVX2 packer (codes256): quarter kJ mod 4 of half kJ /
  // 4 takes the low (quarters 0, 1) or high nibbles of the half's first or second 32 bytes and bits
  // 2 (kJ mod 4) and up of its high-bit bytes, moved to bits 4-5.
  template <int kJ>
  __attribute__((target("avx2"))) static __m256i unsigned256(const unsigned char* block) {
    constexpr int h = kJ / 4, quarter = kJ % 4;
    const __m256i low =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * h + 32 * (quarter % 2)));
    const __m256i nibbles =
        _mm256_and_si256(quarter < 2 ? low : _mm256_srli_epi16(low, 4), _mm256_set1_epi8(0x0F));
    const __m256i bits =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kQ6_KHigh + 32 * h));
    __m256i moved = bits;  // quarter 2: bits 4-5 in place
    if constexpr (quarter == 0) moved = _mm256_slli_epi16(bits, 4);
    if constexpr (quarter == 1) moved = _mm256_slli_epi16(bits, 2);
    if constexpr (quarter == 3) moved = _mm256_srli_epi16(bits, 2);
    return _mm256_or_si256(nibbles, _mm256_and_si256(moved, _mm256_set1_epi8(0x30)));
  }

  template <int kJ>
  __attribute__((target("avx2"))) static __m256i codes256(const unsigned char* block) {
    return _mm256_sub_epi8(unsigned256<kJ>(block), _mm256_set1_epi8(kQ6_KOffset));
  }

  // Half h's two pairs of blocks, unsigned codes q (0 .. 63): its 64 low-nibble bytes as they
  // are (the first pair's low nibbles, the second's high ones), and its 32 high-bit bytes in both
  // halves of a register, shifted per 64-bit lane so that each half's bit pair lands on bits 4-5
  // (bits crossing from a neighbouring byte are masked off): the first pair takes bits 0-1 (low
  // half) and 2-3, the second 4-5 and 6-7. q = (nibbles & 0x0F) | (bits & 0x30), one vpternlogd.
  template <int kH>
  NUMESH_Q8DOT_AVX512 static void half512(const unsigned char* block, __m512i& first,
                                          __m512i& second) {
    const __m512i low = _mm512_loadu_si512(block + 64 * kH);
    const __m512i bits = _mm512_broadcast_i64x4(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kQ6_KHigh + 32 * kH)));
    const __m512i nibble_mask = _mm512_set1_epi8(0x0F), high_mask = _mm512_set1_epi8(0x30);
    const __m512i first_bits = _mm512_and_si512(
        _mm512_sllv_epi64(bits, _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4)), high_mask);
    const __m512i second_bits = _mm512_and_si512(
        _mm512_srlv_epi64(bits, _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0)), high_mask);
    // 0xEC: (a & c) | b
    first = _mm512_ternarylogic_epi32(low, first_bits, nibble_mask, 0xEC);
    second = _mm512_ternarylogic_epi32(_mm512_srli_epi16(low, 4), second_bits, nibble_mask, 0xEC);
  }

  template <bool kVnni, bool kHalf>
  NUMESH_Q8DOT_AVX512 static KquantWeights512 weights512(const unsigned char* block) {
    static_assert(!kHalf, "super-blocks are whole steps");
    KquantWeights512 w;
    half512<0>(block, w.c0, w.c1);
    half512<1>(block, w.c2, w.c3);
    w.scales = detail::kquant_byte_scales512(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kQ6_KScales)),
        detail::q8dot_scale_bits(block + kQ6_KScale));
    w.minimums = _mm256_setzero_ps();
    return w;
  }
};

}  // namespace

constinit const detail::BlockKernels detail::kQ6_KBlockKernels =
    detail::block_kernels_of<Q6_KCodes>();

}  // namespace numesh::ops
