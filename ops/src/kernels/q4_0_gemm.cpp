#include <immintrin.h>

#include <cstdint>

#include "block_kernels.hpp"
#include "numesh/ops/kernels/block_gemm.hpp"
#include "packed_panels.hpp"
#include "q8_dot_common.hpp"

// q4_0's kernels: the shared int8 dot kernel (q8_dot_common.hpp) on Q4_0 blocks: byte j of the
// block's 16 holds q[j] in its low nibble and q[j + 16] in its high one, and the code is q - 8
// (-8 .. 7).

namespace numesh::ops {

namespace {

using detail::Q8dotRow512;
using detail::Q8dotWeights512;

struct Q4_0Codes {
  static constexpr DType kDType = DType::kQ4_0;
  static constexpr std::int64_t kBlockBytes = 18;
  static constexpr std::int64_t kBlockElements = 32;

  static void codes(const unsigned char* block, std::int8_t* q) {
    for (int j = 0; j < 16; ++j) {
      q[j] = static_cast<std::int8_t>((block[2 + j] & 0x0F) - 8);
      q[j + 16] = static_cast<std::int8_t>((block[2 + j] >> 4) - 8);
    }
  }

  // The block's nibbles q (0 .. 15) in element order.
  __attribute__((target("avx2"))) static __m256i nibbles256(const unsigned char* block) {
    return detail::q8dot_nibbles256(block + 2);
  }

  // The codes q - 8, signed, for the prefill tile's AVX2 packer (packed_panels.hpp), whose
  // kernel takes llama.cpp's sign trick.
  __attribute__((target("avx2"))) static __m256i codes256(const unsigned char* block) {
    return _mm256_sub_epi8(nibbles256(block), _mm256_set1_epi8(8));
  }

  // AVX2 decode takes the nibbles as they are and the 8 off once a row (Q8dotActivations::
  // corrections), as AVX-512 does: no abs, sign and subtraction per block and output, 1.12x the
  // sign trick's decode step at the avx2 level (docs/benchmarks.md, "Session 55").
  static constexpr int kOffset256 = 8;
  __attribute__((target("avx2"))) static __m256i unsigned256(const unsigned char* block) {
    return nibbles256(block);
  }

  // AVX-512: the nibbles as they are, unsigned bytes against the signed activation codes, and
  // the 8 taken off once per row: isum = sum q x - 8 (x0 + x1 + x2 + x3), the correction
  // computed from x alone and shared by every output (vpmaddubsw's pair sums stay within
  // 2 * 15 * 127). No sign handling per row and output, and two blocks' 32 bytes unpacked
  // together (q8dot_nibbles512): 1.2-1.3x the sign trick on q - 8 at m = 1, 1.0-1.2x at m = 8 (a
  // throwaway A/B program on BM_Decode_Dot's [4096, 1024] weights, runs interleaved).
  template <bool kVnni, bool kHalf>
  NUMESH_Q8DOT_AVX512 static Q8dotWeights512 weights512(const unsigned char* block) {
    const unsigned char* next = block + kBlockBytes;
    const __m512i q = detail::q8dot_nibbles512<kHalf>(block + 2, next + 2);
    return {q, _mm512_setzero_si512(), 0, detail::q8dot_weight_scales<kHalf>(block, next)};
  }

  template <bool kVnni>
  NUMESH_Q8DOT_AVX512 static Q8dotRow512 row512(__m512i x) {
    return detail::q8dot_offset_row512<8, kVnni>(x);
  }

  // Panels: the nibbles q as they are (the kernel takes 8 (x0 + x1 + x2 + x3) off). Unit u's
  // low nibbles are group u's codes, its high ones group u + 4's.
  static constexpr int kPanelOffset = 8;

  template <int kL>
  NUMESH_Q8DOT_AVX512 static __m512i panel_codes512(const unsigned char* codes) {
    const __m512i unit = _mm512_loadu_si512(codes + 64 * (kL % 4));
    const __m512i nibbles = kL < 4 ? unit : _mm512_srli_epi16(unit, 4);
    return _mm512_and_si512(nibbles, _mm512_set1_epi8(0x0F));
  }

  template <bool kVnni>
  NUMESH_Q8DOT_AVX512 static __m512i isum512(const Q8dotWeights512& w, const Q8dotRow512& row) {
    return detail::q8dot_offset_isum512<8, kVnni>(w.w, row);
  }
};

}  // namespace

constinit const detail::BlockKernels detail::kQ4_0BlockKernels =
    detail::block_kernels_of<Q4_0Codes>();

}  // namespace numesh::ops
