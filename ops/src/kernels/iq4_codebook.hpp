#pragma once

// PRIVATE to ops/src/kernels: IQ4_NL's codebook (core's kIQ4_NLValues) as a byte shuffle's table,
// which iq4_nl_gemm.cpp and iq4_xs_gemm.cpp look their 4-bit indices up in.

#include <immintrin.h>

#include <array>
#include <cstddef>
#include <cstdint>

#include "numesh/core/dtype.hpp"
#include "q8_dot_common.hpp"

namespace numesh::ops::detail {

/// The codebook shifted to unsigned bytes, v + 128 (1 .. 241): vpdpbusd's unsigned operand, the
/// 128 taken off once a row (q8dot_offset_row512<128, true>). vpmaddubsw cannot take them (its
/// pair sums would overflow on 2 * 241 * 127), so below VNNI the values stay signed.
inline constexpr std::array<std::uint8_t, 16> kIQ4_NLUnsignedValues = [] {
  std::array<std::uint8_t, 16> u{};
  for (std::size_t i = 0; i < 16; ++i) u[i] = static_cast<std::uint8_t>(kIQ4_NLValues[i] + 128);
  return u;
}();

/// The codebook's signed values in both 128-bit lanes (AVX2's vpshufb indexes within a lane).
__attribute__((target("avx2"))) inline __m256i iq4_codebook256() {
  return _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4_NLValues.data())));
}

/// The codebook in all four 128-bit lanes: plus 128 (kUnsigned, with VNNI) or signed.
template <bool kUnsigned>
NUMESH_Q8DOT_AVX512 inline __m512i iq4_codebook512() {
  const void* table = kUnsigned ? static_cast<const void*>(kIQ4_NLUnsignedValues.data())
                                : static_cast<const void*>(kIQ4_NLValues.data());
  return _mm512_broadcast_i32x4(_mm_loadu_si128(static_cast<const __m128i*>(table)));
}

/// A row of activation codes for the codebook's values: with VNNI the 128 of v + 128 taken off once
/// a row (q8dot_offset_row512), below it the row as the sign trick takes it.
template <bool kVnni>
NUMESH_Q8DOT_AVX512 inline Q8dotRow512 iq4_row512(__m512i x) {
  if constexpr (kVnni) {
    return q8dot_offset_row512<128, true>(x);
  } else {
    return q8dot_signed_row512<false>(x);
  }
}

}  // namespace numesh::ops::detail
