#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "block_kernels.hpp"
#include "kquant_minimum_scales.hpp"
#include "numesh/ops/kernels/block_gemm.hpp"
#include "packed_panels.hpp"
#include "q8_dot_common.hpp"

// q4_k's kernels: the shared int8 dot kernel (q8_dot_common.hpp) on GGML's Q4_K super-blocks
// (runtime/block_formats.hpp's BlockQ4_K: f16 d at byte 0, f16 dmin at 2, 12 bytes of 6-bit
// scale and minimum codes at 4, 128 bytes of nibbles at 16, each 64 inputs' 32 bytes holding the
// first 32 in their low nibbles and the next 32 in their high ones). Weight e of sub-block j is
// d sc_j q_e - dmin m_j: the kernel multiplies the nibbles q_e as they are (0 .. 15, unsigned
// bytes for vpmaddubsw and vpdpbusd, no correction) and takes the minimums off once a
// super-block from the activations' block sums (block_gemm.hpp's order).

namespace numesh::ops {

namespace {

using detail::KquantBlock;
using detail::KquantScales256;
using detail::KquantWeights512;

constexpr std::int64_t kQ4_KNibbles = 16;

// 144 bytes; one scale per activation block; minimums; unsigned codes at every level.
struct Q4_KCodes : detail::KquantFormat<DType::kQ4_K, 144, 1, true, false, 0> {
  static void decode(const unsigned char* block, KquantBlock& out) {
    detail::kquant_minimum_scales(block, out);
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        const unsigned char byte = block[kQ4_KNibbles + 32 * c + l];
        out.codes[64 * c + l] = static_cast<std::int8_t>(byte & 0x0F);
        out.codes[64 * c + 32 + l] = static_cast<std::int8_t>(byte >> 4);
      }
    }
  }

  __attribute__((target("avx2,f16c"))) static KquantScales256 scales256(
      const unsigned char* block) {
    return detail::kquant_minimum_scales256(block);
  }

  template <int kJ>
  __attribute__((target("avx2"))) static __m256i codes256(const unsigned char* block) {
    return detail::kquant_nibbles256<kJ>(block + kQ4_KNibbles);
  }

  template <int kC>
  NUMESH_Q8DOT_AVX512 static __m512i pair512(const unsigned char* block) {
    return detail::kquant_nibbles512<kC>(block + kQ4_KNibbles);
  }

  template <bool kVnni, bool kHalf>
  NUMESH_Q8DOT_AVX512 static KquantWeights512 weights512(const unsigned char* block) {
    static_assert(!kHalf, "super-blocks are whole steps");
    return detail::kquant_minimum_weights512<Q4_KCodes>(block);
  }
};

}  // namespace

constinit const detail::BlockKernels detail::kQ4_KBlockKernels =
    detail::block_kernels_of<Q4_KCodes>();

}  // namespace numesh::ops
