#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "block_kernels.hpp"
#include "iq4_codebook.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/ops/kernels/block_gemm.hpp"
#include "packed_panels.hpp"
#include "q8_dot_common.hpp"

// iq4_nl's kernels: the shared int8 dot kernel (q8_dot_common.hpp) on IQ4_NL blocks, Q4_0's
// layout (byte j of the block's 16 holds index q[j] in its low nibble and q[j + 16] in its high
// one) whose code is the codebook's value v[q] (kIQ4_NLValues, -127 .. 113): a byte shuffle
// (vpshufb) looks 16 or 64 of them up at once, and the kernel then takes them as Q8_0's signed
// codes.

namespace numesh::ops {

namespace {

using detail::Q8dotRow512;
using detail::Q8dotWeights512;

struct IQ4_NLCodes {
  static constexpr DType kDType = DType::kIQ4_NL;
  static constexpr std::int64_t kBlockBytes = 18;
  static constexpr std::int64_t kBlockElements = 32;

  static void codes(const unsigned char* block, std::int8_t* q) {
    for (int j = 0; j < 16; ++j) {
      q[j] = kIQ4_NLValues[block[2 + j] & 0x0Fu];
      q[j + 16] = kIQ4_NLValues[block[2 + j] >> 4];
    }
  }

  // The values v[q] in element order, signed: the sign trick at AVX2, as Q8_0's codes (|v| <=
  // 127, so vpmaddubsw's pair sums stay within 2 * 127 * 127).
  __attribute__((target("avx2"))) static __m256i codes256(const unsigned char* block) {
    return _mm256_shuffle_epi8(detail::iq4_codebook256(), detail::q8dot_nibbles256(block + 2));
  }

  static constexpr int kOffset256 = 0;

  // AVX-512: two blocks' indices unpacked together (q8dot_nibbles512) and looked up in one
  // shuffle (the table in every 128-bit lane; kHalf keeps the unused high half zero). With VNNI
  // the values come as unsigned bytes v + 128 against the signed activations, and the 128 is
  // taken off once a row, as Q4_0 takes off its 8 (q8dot_offset_row512): no bias product per
  // output and block pair, as Q8_0's signed codes need. Below VNNI vpmaddubsw's int16 pair sums
  // would overflow on 241 * 127 * 2, so there the values stay signed, with Q8_0's sign trick.
  template <bool kVnni, bool kHalf>
  NUMESH_Q8DOT_AVX512 static Q8dotWeights512 weights512(const unsigned char* block) {
    const unsigned char* next = block + kBlockBytes;
    const __m512i table = detail::iq4_codebook512<kVnni>();
    const __m512i indices = detail::q8dot_nibbles512<kHalf>(block + 2, next + 2);
    const __m512i w = kHalf ? _mm512_maskz_shuffle_epi8(__mmask64{0xFFFFFFFFu}, table, indices)
                            : _mm512_shuffle_epi8(table, indices);
    const __m128 d_w = detail::q8dot_weight_scales<kHalf>(block, next);
    if constexpr (kVnni) {
      return {w, _mm512_setzero_si512(), 0, d_w};
    } else {
      return detail::q8dot_signed_weights512<false>(w, d_w);
    }
  }

  template <bool kVnni>
  NUMESH_Q8DOT_AVX512 static Q8dotRow512 row512(__m512i x) {
    return detail::iq4_row512<kVnni>(x);
  }

  template <bool kVnni>
  NUMESH_Q8DOT_AVX512 static __m512i isum512(const Q8dotWeights512& w, const Q8dotRow512& row) {
    if constexpr (kVnni) {
      return detail::q8dot_offset_isum512<128, true>(w.w, row);
    } else {
      return detail::q8dot_signed_isum512<false>(w, row);
    }
  }
};

}  // namespace

constinit const detail::BlockKernels detail::kIQ4_NLBlockKernels =
    detail::block_kernels_of<IQ4_NLCodes>();

}  // namespace numesh::ops
