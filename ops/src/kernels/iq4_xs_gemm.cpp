#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "block_kernels.hpp"
#include "iq4_codebook.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/ops/kernels/block_gemm.hpp"
#include "packed_panels.hpp"
#include "q8_dot_common.hpp"

// iq4_xs's kernels: the shared int8 dot kernel (q8_dot_common.hpp) on GGML's IQ4_XS super-blocks
// (runtime/block_formats.hpp's BlockIQ4_XS: f16 d at byte 0, a 16-bit word of the eight scale
// codes' high bit pairs at 2, their low nibbles in 4 bytes at 4, then 16 bytes a sub-block of 32
// at 8 holding its indices as IQ4_NL holds them). Weight j of sub-block g is d (sc_g - 32)
// v[q_j], v IQ4_NL's codebook: one scale per activation block, no minimums, and the codes the
// codebook's values, looked up by a byte shuffle as iq4_nl_gemm.cpp looks them up.

namespace numesh::ops {

namespace {

using detail::KquantBlock;
using detail::KquantScales256;
using detail::KquantWeights512;

constexpr std::int64_t kIQ4_XSScalesHigh = 2;
constexpr std::int64_t kIQ4_XSScalesLow = 4;
constexpr std::int64_t kIQ4_XSIndices = 8;

// Sub-block g's scale code less 32 (-32 .. 31).
int iq4_xs_scale(const unsigned char* block, int g) {
  const int high =
      ((block[kIQ4_XSScalesHigh] | (block[kIQ4_XSScalesHigh + 1] << 8)) >> (2 * g)) & 3;
  return (((block[kIQ4_XSScalesLow + g / 2] >> (4 * (g % 2))) & 0x0F) | (high << 4)) - 32;
}

// The eight as signed bytes 0-7 of a register, in order, in registers: the low nibbles of the 4
// bytes interleaved (even g low, odd g high), and each high bit pair moved up by a multiply per
// 16-bit lane (a left shift by 14 - 2 g) and down by 14. Bytes 8-15 are -32 and never read (one
// scale a block: lanes 0-7).
__attribute__((target("avx2"))) inline __m128i iq4_xs_scale_bytes(const unsigned char* block) {
  std::uint32_t low_bits;
  std::memcpy(&low_bits, block + kIQ4_XSScalesLow, sizeof low_bits);
  std::uint16_t high_bits;
  std::memcpy(&high_bits, block + kIQ4_XSScalesHigh, sizeof high_bits);
  const __m128i low = _mm_cvtsi32_si128(static_cast<int>(low_bits));
  const __m128i nibbles =
      _mm_unpacklo_epi8(_mm_and_si128(low, _mm_set1_epi8(0x0F)),
                        _mm_and_si128(_mm_srli_epi16(low, 4), _mm_set1_epi8(0x0F)));
  const __m128i pairs = _mm_srli_epi16(
      _mm_mullo_epi16(_mm_set1_epi16(static_cast<short>(high_bits)),
                      _mm_setr_epi16(1 << 14, 1 << 12, 1 << 10, 1 << 8, 1 << 6, 1 << 4, 1 << 2, 1)),
      14);
  const __m128i high = _mm_packus_epi16(pairs, _mm_setzero_si128());
  return _mm_sub_epi8(_mm_or_si128(nibbles, _mm_slli_epi16(high, 4)), _mm_set1_epi8(32));
}

// 136 bytes; one scale per activation block; no minimums; signed codes (the codebook's values):
// the sign trick at AVX2 and at AVX-512 without VNNI, the values plus 128 against the row's
// correction with VNNI (as iq4_nl_gemm.cpp: vpmaddubsw's pair sums would overflow on 241).
struct IQ4_XSCodes : detail::KquantFormat<DType::kIQ4_XS, 136, 1, false, true, 0> {
  // Scales d (sc_g - 32): an f16 times a 6-bit integer, exact in f32; codes v[q].
  static void decode(const unsigned char* block, KquantBlock& out) {
    const float d = f32_from_f16(detail::q8dot_scale_bits(block));
    for (int g = 0; g < 8; ++g) {
      out.scales[g] = d * static_cast<float>(iq4_xs_scale(block, g));
      const unsigned char* qs = block + kIQ4_XSIndices + 16 * g;
      for (int j = 0; j < 16; ++j) {
        out.codes[32 * g + j] = kIQ4_NLValues[qs[j] & 0x0Fu];
        out.codes[32 * g + 16 + j] = kIQ4_NLValues[qs[j] >> 4];
      }
    }
  }

  __attribute__((target("avx2,f16c"))) static KquantScales256 scales256(
      const unsigned char* block) {
    return detail::kquant_byte_scales256(iq4_xs_scale_bytes(block),
                                         detail::q8dot_scale_bits(block));
  }

  // Block kJ's 32 values, signed (the sign trick's and the prefill tile's AVX2 packer's codes).
  template <int kJ>
  __attribute__((target("avx2"))) static __m256i codes256(const unsigned char* block) {
    return _mm256_shuffle_epi8(detail::iq4_codebook256(),
                               detail::q8dot_nibbles256(block + kIQ4_XSIndices + 16 * kJ));
  }

  // Pair kC (blocks 2 kC and 2 kC + 1) looked up in `table`, the codebook in every 128-bit lane.
  template <int kC>
  NUMESH_Q8DOT_AVX512 static __m512i pair512(const unsigned char* block, __m512i table) {
    const unsigned char* qs = block + kIQ4_XSIndices + 32 * kC;
    return _mm512_shuffle_epi8(table, detail::q8dot_nibbles512<false>(qs, qs + 16));
  }

  template <bool kVnni, bool kHalf>
  NUMESH_Q8DOT_AVX512 static KquantWeights512 weights512(const unsigned char* block) {
    static_assert(!kHalf, "super-blocks are whole steps");
    const __m512i table = detail::iq4_codebook512<kVnni>();
    KquantWeights512 w;
    w.c0 = pair512<0>(block, table);
    w.c1 = pair512<1>(block, table);
    w.c2 = pair512<2>(block, table);
    w.c3 = pair512<3>(block, table);
    w.scales =
        detail::kquant_byte_scales512(iq4_xs_scale_bytes(block), detail::q8dot_scale_bits(block));
    w.minimums = _mm256_setzero_ps();
    return w;
  }

  template <bool kVnni>
  NUMESH_Q8DOT_AVX512 static detail::Q8dotRow512 row512(__m512i x) {
    return detail::iq4_row512<kVnni>(x);
  }

  template <bool kVnni>
  NUMESH_Q8DOT_AVX512 static __m512i isum512(__m512i codes, const detail::Q8dotRow512& row) {
    if constexpr (kVnni) {
      return detail::q8dot_offset_isum512<128, true>(codes, row);
    } else {
      return detail::q8dot_signed_isum512<false>(
          detail::q8dot_signed_weights512<false>(codes, _mm_setzero_ps()), row);
    }
  }
};

}  // namespace

constinit const detail::BlockKernels detail::kIQ4_XSBlockKernels =
    detail::block_kernels_of<IQ4_XSCodes>();

}  // namespace numesh::ops
