#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "numesh/ops/kernels/block_gemm.hpp"
#include "packed_panels.hpp"
#include "q8_dot_common.hpp"

// dot_gemm_q4_k: the shared int8 dot kernel (q8_dot_common.hpp) on GGML's Q4_K super-blocks
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

constexpr std::int64_t kQ4_KPacked = 4;  // bytes: the 6-bit codes
constexpr std::int64_t kQ4_KNibbles = 16;

// The 12 bytes of 6-bit codes unpacked to [sc_0 .. sc_7, m_0 .. m_7] (GGML's get_scale_min_k4)
// on their three little-endian 32-bit words u0, u1, u2, masks in every byte:
//   sc_0-3 = u0 & 0x3F, sc_4-7 = (u2 & 0x0F) | ((u0 >> 2) & 0x30),
//   m_0-3 = u1 & 0x3F,  m_4-7 = ((u2 >> 4) & 0x0F) | ((u1 >> 2) & 0x30)
// ((u >> 2) & 0x30 is each byte's top two bits moved to bits 4-5).
void q4_k_scale_codes(const unsigned char* packed, std::uint8_t* out) {
  std::uint32_t u[3];
  std::memcpy(u, packed, sizeof(u));
  const std::uint32_t words[4] = {
      u[0] & 0x3F3F3F3Fu, (u[2] & 0x0F0F0F0Fu) | ((u[0] >> 2) & 0x30303030u), u[1] & 0x3F3F3F3Fu,
      ((u[2] >> 4) & 0x0F0F0F0Fu) | ((u[1] >> 2) & 0x30303030u)};
  std::memcpy(out, words, sizeof(words));
}

// The same on one vector: lanes [u0, u2, u1, u2 >> 4] masked, or lanes [-, u0, -, u1] moved.
// The load takes 16 bytes: the 12 and the first 4 of the nibbles, in the same block.
__attribute__((target("avx2"))) __m128i q4_k_scale_codes128(const unsigned char* packed) {
  const __m128i u = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed));
  const __m128i low = _mm_and_si128(
      _mm_srlv_epi32(_mm_shuffle_epi32(u, _MM_SHUFFLE(2, 1, 2, 0)), _mm_setr_epi32(0, 0, 0, 4)),
      _mm_setr_epi32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F));
  const __m128i high =
      _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(u, _MM_SHUFFLE(1, 0, 0, 0)), 2),
                    _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
  return _mm_or_si128(low, high);
}

// 144 bytes; one scale per activation block; minimums; unsigned codes at every level.
struct Q4_KCodes : detail::KquantFormat<DType::kQ4_K, 144, 1, true, false, 0> {
  // Scales d sc_j and negated minimums -(dmin m_j): an f16 times a 6-bit code, exact in f32.
  static void decode(const unsigned char* block, KquantBlock& out) {
    std::uint8_t codes[16];
    q4_k_scale_codes(block + kQ4_KPacked, codes);
    const float d = f32_from_f16(detail::q8dot_scale_bits(block));
    const float dmin = f32_from_f16(detail::q8dot_scale_bits(block + 2));
    for (int j = 0; j < 8; ++j) {
      out.scales[j] = d * static_cast<float>(codes[j]);
      out.minimums[j] = -(dmin * static_cast<float>(codes[8 + j]));
    }
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
    const __m128i codes = q4_k_scale_codes128(block + kQ4_KPacked);
    const __m128 d_dmin = _mm_cvtph_ps(_mm_cvtsi32_si128(
        static_cast<int>(detail::q8dot_scale_bits(block) |
                         (std::uint32_t{detail::q8dot_scale_bits(block + 2)} << 16))));
    const __m256 scales = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(codes)),
                                        _mm256_broadcastss_ps(d_dmin));
    const __m256 mins =
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(codes, 8))),
                      _mm256_broadcastss_ps(_mm_movehdup_ps(d_dmin)));
    return {scales, scales, _mm256_xor_ps(mins, _mm256_set1_ps(-0.0f))};
  }

  // Block kJ's nibbles: the low ones of its pair's 32 bytes for the even block, the high ones
  // (a 16-bit shift down, the mask dropping the next byte's) for the odd.
  template <int kJ>
  __attribute__((target("avx2"))) static __m256i codes256(const unsigned char* block) {
    const __m256i bytes =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kQ4_KNibbles + 32 * (kJ / 2)));
    return _mm256_and_si256(kJ % 2 == 0 ? bytes : _mm256_srli_epi16(bytes, 4),
                            _mm256_set1_epi8(0x0F));
  }

  // Pair kC's nibbles: its 32 bytes in both halves of a register, the high half shifted down.
  template <int kC>
  NUMESH_Q8DOT_AVX512 static __m512i pair512(const unsigned char* block) {
    const __m512i bytes = _mm512_broadcast_i64x4(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kQ4_KNibbles + 32 * kC)));
    return _mm512_and_si512(_mm512_mask_srli_epi16(bytes, 0xFFFF0000u, bytes, 4),
                            _mm512_set1_epi8(0x0F));
  }

  template <bool kVnni, bool kHalf>
  NUMESH_Q8DOT_AVX512 static KquantWeights512 weights512(const unsigned char* block) {
    static_assert(!kHalf, "super-blocks are whole steps");
    const KquantScales256 s = scales256(block);
    return {pair512<0>(block),
            pair512<1>(block),
            pair512<2>(block),
            pair512<3>(block),
            _mm512_zextps256_ps512(s.low),
            s.minimums};
  }
};

}  // namespace

void dot_gemm_q4_k(std::int64_t m, const std::int8_t* codes, const float* scales,
                   const WeightMatrix& b, float* c, std::int64_t ldc, runtime::KernelLevel level) {
  detail::q8dot_gemm<Q4_KCodes>("dot_gemm_q4_k", m, codes, scales, b, c, ldc, level);
}

void detail::pack_panel_q4_k(const unsigned char* w, std::int64_t ldw, std::int64_t count,
                             std::int64_t blocks, runtime::KernelLevel level, bool vnni_bias,
                             detail::PackedBlock* out) {
  detail::pack_kquant_panel<Q4_KCodes>(w, ldw, count, blocks, level, vnni_bias, out);
}

}  // namespace numesh::ops
