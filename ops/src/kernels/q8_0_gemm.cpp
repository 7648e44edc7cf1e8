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

  // Below VNNI, llama.cpp's sign trick (as the AVX2 step, q8dot_step256): |w| as unsigned bytes
  // (-128 gives 128) times x given w's sign (a masked negation), vpmaddubsw's int16 pair sums
  // within 2 * 128 * 127 = 32512, then vpmaddwd with ones. With VNNI, the bias trick instead:
  // x + 128 (x ^ 0x80) is an unsigned byte, so one vpdpbusd takes (x + 128) w, starting from
  // -128 (w0 + w1 + w2 + w3), which the weights give once for every row. Exact either way (a
  // lane's sums stay within 4 * 255 * 128). The bias trick has no negation per row and output:
  // 1.05x the sign trick's speed at m = 1, 1.12x at m = 8 (a throwaway A/B program on
  // BM_Decode_Dot's [4096, 1024] weights, runs interleaved).
  template <bool kVnni, bool kHalf>
  NUMESH_Q8DOT_AVX512 static Q8dotWeights512 weights512(const unsigned char* block) {
    const unsigned char* next = block + kBlockBytes;
    const __m512i w =
        kHalf ? _mm512_zextsi256_si512(codes256(block))
              : _mm512_inserti64x4(_mm512_castsi256_si512(codes256(block)), codes256(next), 1);
    const __m128 d_w = detail::q8dot_weight_scales<kHalf>(block, next);
    if constexpr (kVnni) {
      const __m512i bias =
          _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(static_cast<char>(0x80)), w);
      return {w, _mm512_sub_epi32(_mm512_setzero_si512(), bias), 0, d_w};
    } else {
      return {w, _mm512_abs_epi8(w), _mm512_movepi8_mask(w), d_w};
    }
  }

  template <bool kVnni>
  NUMESH_Q8DOT_AVX512 static Q8dotRow512 row512(__m512i x) {
    if constexpr (kVnni) {
      return {_mm512_xor_si512(x, _mm512_set1_epi8(static_cast<char>(0x80))),
              _mm512_setzero_si512()};
    } else {
      return {x, _mm512_setzero_si512()};
    }
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
    if constexpr (kVnni) {
      return _mm512_dpbusd_epi32(w.aux, row.x, w.w);
    } else {
      const __m512i signed_x =
          _mm512_mask_sub_epi8(row.x, w.negative, _mm512_setzero_si512(), row.x);
      return _mm512_madd_epi16(_mm512_maddubs_epi16(w.aux, signed_x), _mm512_set1_epi16(1));
    }
  }
};

}  // namespace

constinit const detail::BlockKernels detail::kQ8_0BlockKernels =
    detail::block_kernels_of<Q8_0Codes>();

}  // namespace numesh::ops
