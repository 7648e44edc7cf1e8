#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "block_kernels.hpp"
#include "numesh/ops/kernels/block_gemm.hpp"
#include "packed_panels.hpp"
#include "q8_dot_common.hpp"

// q8_0's kernels: the shared int8 dot kernel (q8_dot_common.hpp) on Q8_0 blocks, whose 32 codes
// are the block's bytes 2 .. 33 as they are.

namespace numesh::ops {

namespace {

using detail::Q8dotRow512;
using detail::Q8dotWeights512;

struct Q8_0Codes {
  static constexpr DType kDType = DType::kQ8_0;
  static constexpr std::int64_t kBlockBytes = 34;
  static constexpr std::int64_t kBlockElements = 32;

  static void codes(const unsigned char* block, std::int8_t* q) { std::memcpy(q, block + 2, 32); }

  __attribute__((target("avx2"))) static __m256i codes256(const unsigned char* block) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
  }

  // Signed as stored: the sign trick at AVX2.
  static constexpr int kOffset256 = 0;

  // Signed codes as they are: the sign trick below VNNI, the bias trick with it
  // (q8dot_signed_weights512).
  template <bool kVnni, bool kHalf>
  NUMESH_Q8DOT_AVX512 static Q8dotWeights512 weights512(const unsigned char* block) {
    const unsigned char* next = block + kBlockBytes;
    const __m512i w =
        kHalf ? _mm512_zextsi256_si512(codes256(block))
              : _mm512_inserti64x4(_mm512_castsi256_si512(codes256(block)), codes256(next), 1);
    return detail::q8dot_signed_weights512<kVnni>(w,
                                                  detail::q8dot_weight_scales<kHalf>(block, next));
  }

  template <bool kVnni>
  NUMESH_Q8DOT_AVX512 static Q8dotRow512 row512(__m512i x) {
    return detail::q8dot_signed_row512<kVnni>(x);
  }

  // Panels: the codes as unsigned bytes q + 128 (q ^ 0x80), against the signed activations.
  static constexpr int kPanelOffset = 128;

  template <int kL>
  NUMESH_Q8DOT_AVX512 static __m512i panel_codes512(const unsigned char* codes) {
    return _mm512_xor_si512(_mm512_loadu_si512(codes + 64 * kL),
                            _mm512_set1_epi8(static_cast<char>(0x80)));
  }

  template <bool kVnni>
  NUMESH_Q8DOT_AVX512 static __m512i isum512(const Q8dotWeights512& w, const Q8dotRow512& row) {
    return detail::q8dot_signed_isum512<kVnni>(w, row);
  }
};

}  // namespace

constinit const detail::BlockKernels detail::kQ8_0BlockKernels =
    detail::block_kernels_of<Q8_0Codes>();

}  // namespace numesh::ops
