#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "block_kernels.hpp"
#include "numesh/ops/kernels/block_gemm.hpp"
#include "packed_panels.hpp"
#include "q8_dot_common.hpp"

// q5_0's kernels: the shared int8 dot kernel (q8_dot_common.hpp) on Q5_0 blocks: Q4_0's nibbles
// (bytes 6-21) with a fifth bit each from the little-endian word at bytes 2-5 (bit j: element
// j's), and the code q - 16 (-16 .. 15). The kernel takes q unsigned (0 .. 31) and the 16 off once
// a row, as Q4_0 takes its 8 (vpmaddubsw's pair sums stay within 2 * 31 * 127).

namespace numesh::ops {

namespace {

using detail::Q8dotRow512;
using detail::Q8dotWeights512;

struct Q5_0Codes {
  static constexpr DType kDType = DType::kQ5_0;
  static constexpr std::int64_t kBlockBytes = 22;
  static constexpr std::int64_t kBlockElements = 32;

  // The block's word of fifth bits.
  static std::uint32_t fifth_bits(const unsigned char* block) {
    return block[2] | (std::uint32_t{block[3]} << 8) | (std::uint32_t{block[4]} << 16) |
           (std::uint32_t{block[5]} << 24);
  }

  static void codes(const unsigned char* block, std::int8_t* q) {
    const std::uint32_t high = fifth_bits(block);
    for (int j = 0; j < 16; ++j) {
      q[j] = static_cast<std::int8_t>(
          static_cast<int>((block[6 + j] & 0x0Fu) | (((high >> j) & 1u) << 4)) - 16);
      q[j + 16] = static_cast<std::int8_t>(
          static_cast<int>((block[6 + j] >> 4) | (((high >> (j + 16)) & 1u) << 4)) - 16);
    }
  }

  // The codes q (0 .. 31) in element order: the nibbles, and 16 in byte j where bit j of the word
  // is set (byte j takes byte j / 8 of the word, which the shuffle finds in every dword of its
  // 128-bit lane, and keeps its bit j mod 8).
  __attribute__((target("avx2"))) static __m256i unsigned256(const unsigned char* block) {
    const __m256i word = _mm256_set1_epi32(static_cast<int>(fifth_bits(block)));
    const __m256i spread =
        _mm256_shuffle_epi8(word, _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                   2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_or_si256(detail::q8dot_nibbles256(block + 6),
                           _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
  }

  // The codes q - 16, signed, for the prefill tile's AVX2 packer (packed_panels.hpp).
  __attribute__((target("avx2"))) static __m256i codes256(const unsigned char* block) {
    return _mm256_sub_epi8(unsigned256(block), _mm256_set1_epi8(16));
  }

  static constexpr int kOffset256 = 16;

  // AVX-512: two blocks' nibbles unpacked together (q8dot_nibbles512) and their fifth bits as
  // one 64-bit mask, bit e for byte e: a masked move puts the 16s in.
  template <bool kVnni, bool kHalf>
  NUMESH_Q8DOT_AVX512 static Q8dotWeights512 weights512(const unsigned char* block) {
    const unsigned char* next = block + kBlockBytes;
    const __mmask64 high = kHalf
                               ? __mmask64{fifth_bits(block)}
                               : __mmask64{fifth_bits(block)} | (__mmask64{fifth_bits(next)} << 32);
    const __m512i q = _mm512_or_si512(detail::q8dot_nibbles512<kHalf>(block + 6, next + 6),
                                      _mm512_maskz_mov_epi8(high, _mm512_set1_epi8(0x10)));
    return {q, _mm512_setzero_si512(), 0, detail::q8dot_weight_scales<kHalf>(block, next)};
  }

  template <bool kVnni>
  NUMESH_Q8DOT_AVX512 static Q8dotRow512 row512(__m512i x) {
    return detail::q8dot_offset_row512<16, kVnni>(x);
  }

  template <bool kVnni>
  NUMESH_Q8DOT_AVX512 static __m512i isum512(const Q8dotWeights512& w, const Q8dotRow512& row) {
    return detail::q8dot_offset_isum512<16, kVnni>(w.w, row);
  }
};

}  // namespace

constinit const detail::BlockKernels detail::kQ5_0BlockKernels =
    detail::block_kernels_of<Q5_0Codes>();

}  // namespace numesh::ops
