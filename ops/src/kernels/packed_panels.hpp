#pragma once

// PRIVATE to ops/src/kernels: the panels that packed_gemm_q8 (block_gemm.hpp) multiplies, and
// how each block format packs its weights into them: a format's entry in block_kernels.hpp takes
// its packer from the generic ones below with its own codes class (q8_dot_common.hpp's
// interface), so that a format's prefill needs no code of its own.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "numesh/core/dtype.hpp"
#include "numesh/runtime/convert.hpp"
#include "numesh/runtime/cpu_features.hpp"
#include "q8_dot_common.hpp"

namespace numesh::ops::detail {

/// Outputs of a packed panel: one 512-bit register of int32 or f32 lanes.
inline constexpr std::int64_t kPanelOutputs = 16;
/// Groups of 4 inputs in an activation block of 32.
inline constexpr std::int64_t kPanelGroups = 8;

/// One activation block's 32 inputs of 16 outputs, packed: group g's 4 weight codes of output o
/// at codes[g][o]; the scale of inputs 0-15 and of 16-31 (equal where the format has one scale a
/// block); Q4_K's negated minimum -dmin m (else 0); for the VNNI kernel, whose activations are
/// unsigned (x + 128), -128 times the sum of each output's codes of inputs 0-15 and 16-31
/// (`bias` holding the whole block's where the format has one scale a block). Outputs past the
/// weights' last have codes, scales and minimums 0.
struct alignas(64) PackedBlock {
  std::int8_t codes[kPanelGroups][kPanelOutputs][4];
  float scales[kPanelOutputs];
  float scales_high[kPanelOutputs];
  float minimums[kPanelOutputs];
  std::int32_t bias[kPanelOutputs];
  std::int32_t bias_high[kPanelOutputs];
};
static_assert(sizeof(PackedBlock) == 832, "a packed block is 13 cache lines");

/// Packs outputs [0, count) (count <= 16) of the weights at `w` (rows `ldw` bytes apart), all
/// `blocks` activation blocks of them, into out[0 .. blocks). The same bytes at every level; the
/// bias is written only when `vnni_bias` (the VNNI kernel's rows read it; AMX's and the other
/// levels' do not), else left as it was.
using PanelPacker = void (*)(const unsigned char* w, std::int64_t ldw, std::int64_t count,
                             std::int64_t blocks, runtime::KernelLevel level, bool vnni_bias,
                             PackedBlock* out);

// ---- The generic packers -----------------------------------------------------------------------

/// 16 outputs' 32 codes of one block (q[o]), transposed 4 at a time into p.codes.
inline void put_panel_codes(const std::int8_t (*q)[kQ8DotBlock], PackedBlock& p) {
  for (std::int64_t g = 0; g < kPanelGroups; ++g) {
    for (std::int64_t o = 0; o < kPanelOutputs; ++o) std::memcpy(p.codes[g][o], q[o] + 4 * g, 4);
  }
}

/// The VNNI kernel's starting sums (vpdpbusd of ones against each group's codes gives every
/// output's sum of 4): over groups 0-7 into `bias`, or 0-3 and 4-7 for two scales a block.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) inline void put_panel_bias(PackedBlock& p,
                                                                                  bool two_scales) {
  const __m512i ones = _mm512_set1_epi8(1), minus128 = _mm512_set1_epi32(-128);
  __m512i low = _mm512_setzero_si512(), high = _mm512_setzero_si512();
  for (std::int64_t g = 0; g < kPanelGroups; ++g) {
    __m512i& sum = two_scales && g >= kPanelGroups / 2 ? high : low;
    sum = _mm512_dpbusd_epi32(sum, ones, _mm512_load_si512(p.codes[g]));
  }
  _mm512_store_si512(p.bias, _mm512_mullo_epi32(low, minus128));
  _mm512_store_si512(p.bias_high, _mm512_mullo_epi32(high, minus128));
}

/// A pair format's block of codes by AVX2 into q (F::codes256).
template <class F>
__attribute__((target("avx2"))) void pair_codes256(const unsigned char* block, std::int8_t* q) {
  _mm256_store_si256(reinterpret_cast<__m256i*>(q), F::codes256(block));
}

/// The pair formats' packer (Q8_0, Q4_0, Q5_0: a block of 32 codes and an f16 scale in its first
/// two bytes): F::codes at the scalar level, F::codes256 above it.
template <class F>
void pack_pair_panel(const unsigned char* w, std::int64_t ldw, std::int64_t count,
                     std::int64_t blocks, runtime::KernelLevel level, bool vnni_bias,
                     PackedBlock* out) {
  alignas(32) std::int8_t q[kPanelOutputs][kQ8DotBlock] = {};
  std::uint16_t scale_bits[kPanelOutputs] = {};
  for (std::int64_t t = 0; t < blocks; ++t) {
    PackedBlock& p = out[t];
    for (std::int64_t o = 0; o < count; ++o) {
      const unsigned char* block = w + o * ldw + t * F::kBlockBytes;
      if (level == runtime::KernelLevel::kScalar) {
        F::codes(block, q[o]);
      } else {
        pair_codes256<F>(block, q[o]);
      }
      scale_bits[o] = q8dot_scale_bits(block);
    }
    put_panel_codes(q, p);
    runtime::convert_f16_to_f32(scale_bits, p.scales, level);
    std::copy_n(p.scales, kPanelOutputs, p.scales_high);
    std::fill_n(p.minimums, kPanelOutputs, 0.0f);
    if (vnni_bias) put_panel_bias(p, /*two_scales=*/false);
  }
}

/// A stored panel's block (runtime/weight_panels.hpp): its 16 outputs' f16 scales, then their
/// codes (Q8_0 32 bytes an output, Q4_0 16).
inline constexpr std::int64_t kStoredScaleBytes = 2 * kPanelOutputs;
template <DType kFormat>
inline constexpr std::int64_t kStoredBlockBytes = kStoredScaleBytes +
                                                  kPanelOutputs*(kFormat == DType::kQ8_0 ? 32 : 16);

/// A stored panel's 16 f16 scales (at `bits`) as f32, by F16C: the values convert_f16_to_f32
/// gives, without its call and dispatch for every block (which took a third of the packing).
__attribute__((target("avx2,f16c"))) inline void panel_scales_f16c(const unsigned char* bits,
                                                                   float* out) {
  _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bits))));
  _mm256_storeu_ps(out + 8,
                   _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bits + 16))));
}

/// Packs a stored panel of Q8_0 or Q4_0 weights (runtime/weight_panels.hpp: 16 outputs, `blocks`
/// blocks, at `panel`) into out[0 .. blocks): its codes already lie in PackedBlock's order, 4
/// codes of an output for each group, Q8_0's as they are and Q4_0's split into their nibbles
/// less 8; the same bytes as pack_pair_panel makes of the panel's rows.
template <DType kFormat>
void pack_stored_panel(const unsigned char* panel, std::int64_t blocks, runtime::KernelLevel level,
                       bool vnni_bias, PackedBlock* out) {
  static_assert(kFormat == DType::kQ8_0 || kFormat == DType::kQ4_0);
  for (std::int64_t t = 0; t < blocks; ++t) {
    const unsigned char* block = panel + t * kStoredBlockBytes<kFormat>;
    PackedBlock& p = out[t];
    if constexpr (kFormat == DType::kQ8_0) {
      std::memcpy(p.codes, block + kStoredScaleBytes, sizeof p.codes);
    } else {
      for (std::int64_t g = 0; g < kPanelGroups / 2; ++g) {
        const unsigned char* unit = block + kStoredScaleBytes + g * sizeof p.codes[0];
        auto* low = &p.codes[g][0][0];
        auto* high = &p.codes[g + kPanelGroups / 2][0][0];
        for (std::size_t i = 0; i < sizeof p.codes[0]; ++i) {
          low[i] = static_cast<std::int8_t>((unit[i] & 0x0F) - 8);
          high[i] = static_cast<std::int8_t>((unit[i] >> 4) - 8);
        }
      }
    }
    if (level >= runtime::KernelLevel::kAvx2) {
      panel_scales_f16c(block, p.scales);
    } else {
      std::uint16_t scale_bits[kPanelOutputs];
      std::memcpy(scale_bits, block, sizeof scale_bits);
      runtime::convert_f16_to_f32(scale_bits, p.scales, level);
    }
    std::copy_n(p.scales, kPanelOutputs, p.scales_high);
    std::fill_n(p.minimums, kPanelOutputs, 0.0f);
    if (vnni_bias) put_panel_bias(p, /*two_scales=*/false);
  }
}

/// A super-block's 8 blocks of codes by AVX2 into q[j][o] (F::codes256<j>).
template <class F, int... kJ>
__attribute__((target("avx2"))) void kquant_codes256(const unsigned char* block, std::int64_t o,
                                                     std::int8_t (*q)[kPanelOutputs][kQ8DotBlock],
                                                     std::integer_sequence<int, kJ...>) {
  (_mm256_store_si256(reinterpret_cast<__m256i*>(q[kJ][o]), F::template codes256<kJ>(block)), ...);
}

/// A super-block's 16 sub-block scales and 8 negated minimums by AVX2 (F::scales256).
template <class F>
__attribute__((target("avx2,f16c"))) void kquant_scales256(const unsigned char* block,
                                                           float* scales, float* minimums) {
  const KquantScales256 s = F::scales256(block);
  _mm256_storeu_ps(scales, s.low);
  _mm256_storeu_ps(scales + 8, s.high);
  _mm256_storeu_ps(minimums, s.minimums);
}

/// The super-block formats' packer (the K formats: 8 activation blocks a super-block): F::decode at
/// the scalar level, F::codes256 and F::scales256 above it (the same exact values).
template <class F>
void pack_kquant_panel(const unsigned char* w, std::int64_t ldw, std::int64_t count,
                       std::int64_t blocks, runtime::KernelLevel level, bool vnni_bias,
                       PackedBlock* out) {
  constexpr int kS = F::kScalesPerBlock;
  alignas(32) std::int8_t q[kKquantBlocks][kPanelOutputs][kQ8DotBlock] = {};
  float scales[kPanelOutputs][16] = {};
  float minimums[kPanelOutputs][kKquantBlocks] = {};
  for (std::int64_t b = 0; b < blocks / kKquantBlocks; ++b) {
    for (std::int64_t o = 0; o < count; ++o) {
      const unsigned char* block = w + o * ldw + b * F::kBlockBytes;
      if (level == runtime::KernelLevel::kScalar) {
        KquantBlock decoded{};  // a format fills what it has (Q4_K 8 scales; Q6_K no minimums)
        F::decode(block, decoded);
        for (std::int64_t j = 0; j < kKquantBlocks; ++j)
          std::memcpy(q[j][o], decoded.codes + j * kQ8DotBlock, kQ8DotBlock);
        std::copy_n(decoded.scales, 16, scales[o]);
        std::copy_n(decoded.minimums, kKquantBlocks, minimums[o]);
      } else {
        kquant_codes256<F>(block, o, q, std::make_integer_sequence<int, kKquantBlocks>());
        kquant_scales256<F>(block, scales[o], minimums[o]);
      }
    }
    for (std::int64_t j = 0; j < kKquantBlocks; ++j) {
      PackedBlock& p = out[b * kKquantBlocks + j];
      put_panel_codes(q[j], p);
      for (std::int64_t o = 0; o < kPanelOutputs; ++o) {
        p.scales[o] = scales[o][kS * j];
        p.scales_high[o] = scales[o][kS * j + kS - 1];
        p.minimums[o] = F::kMinimums ? minimums[o][j] : 0.0f;
      }
      if (vnni_bias) put_panel_bias(p, kS == 2);
    }
  }
}

}  // namespace numesh::ops::detail
