// GGML's block codecs (Q8_0, Q4_0, Q5_0, IQ4_NL, Q3_K, Q4_K, Q6_K) on hand-checked blocks: scales
// and codes worked out from GGML's definitions, the rounding of exact halves, the sign of the Q4_0
// scale, nibble and 6-bit packing, the blocks where GGML's reference is undefined or overflows,
// round-trip error bounds on random rows, and the errors. tests/runtime/block_formats_check.py
// compares bytes with a NumPy transcription of GGML (and GGML itself) on many more rows.

#include "numesh/runtime/block_formats.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "../common/kernel_levels.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"

namespace numesh::runtime {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

constexpr std::size_t kBlock = 32;

BlockQ8_0 q8_of(const std::array<float, kBlock>& x) {
  BlockQ8_0 b{};
  quantize_q8_0(x, std::span<BlockQ8_0>(&b, 1));
  return b;
}
BlockQ4_0 q4_of(const std::array<float, kBlock>& x) {
  BlockQ4_0 b{};
  quantize_q4_0(x, std::span<BlockQ4_0>(&b, 1));
  return b;
}
// Code j (0 .. 15) of a Q4_0 block: the low nibbles hold codes 0 .. 15, the high ones 16 .. 31.
int q4_code(const BlockQ4_0& b, std::size_t j) {
  return j < 16 ? (b.qs[j] & 0x0F) : (b.qs[j - 16] >> 4);
}
BlockQ5_0 q5_of(const std::array<float, kBlock>& x) {
  BlockQ5_0 b{};
  quantize_q5_0(x, std::span<BlockQ5_0>(&b, 1));
  return b;
}
// Code j (0 .. 31) of a Q5_0 block: Q4_0's nibble, and bit j of the little-endian word qh as its
// fifth bit.
int q5_code(const BlockQ5_0& b, std::size_t j) {
  const int nibble = j < 16 ? (b.qs[j] & 0x0F) : (b.qs[j - 16] >> 4);
  return nibble | (((b.qh[j / 8] >> (j % 8)) & 1) << 4);
}
std::array<float, kBlock> filled(float v) {
  std::array<float, kBlock> x{};
  x.fill(v);
  return x;
}

TEST(BlockQ8_0Test, ZerosGiveAZeroScaleAndZeroCodes) {
  for (float zero : {0.0f, -0.0f}) {
    const BlockQ8_0 b = q8_of(filled(zero));
    EXPECT_EQ(b.d, 0x0000) << "0 / 127 is +0 whatever the zeros' signs";
    for (std::int8_t q : b.qs) EXPECT_EQ(q, 0);
  }
}

TEST(BlockQ8_0Test, TheLargestMagnitudeIsCode127AndTheRestScaleWithIt) {
  std::array<float, kBlock> x = filled(0.9f);  // 0.45 after scaling: code 0
  x[7] = 254.0f;                               // d = 254 / 127 = 2 exactly, id = 0.5
  x[3] = 1.0f;                                 // 0.5: away from zero, 1
  x[4] = -3.0f;                                // -1.5: away from zero, -2
  x[5] = -254.0f;                              // a tie of magnitudes: -127, same scale
  const BlockQ8_0 b = q8_of(x);
  EXPECT_EQ(b.d, 0x4000) << "f16 2.0";
  EXPECT_EQ(b.qs[7], 127);
  EXPECT_EQ(b.qs[5], -127);
  EXPECT_EQ(b.qs[3], 1);
  EXPECT_EQ(b.qs[4], -2);
  EXPECT_EQ(b.qs[0], 0);
}

TEST(BlockQ8_0Test, ExactHalvesRoundAwayFromZeroNotToEven) {
  std::array<float, kBlock> x{};
  x[0] = 127.0f;  // d = 1, id = 1: every value below is its own scaled value
  x[1] = 0.5f;
  x[2] = -0.5f;
  x[3] = 2.5f;
  x[4] = -2.5f;
  x[5] = 126.5f;
  x[6] = 0.49999997f;  // 0.5 - 2^-25: 0 (adding 0.5 in f32 would round to 1)
  x[7] = -0.49999997f;
  const BlockQ8_0 b = q8_of(x);
  EXPECT_EQ(b.d, 0x3C00) << "f16 1.0";
  const std::int8_t want[] = {127, 1, -1, 3, -3, 127, 0, 0};
  for (std::size_t j = 0; j < std::size(want); ++j) EXPECT_EQ(b.qs[j], want[j]) << "code " << j;
}

TEST(BlockQ8_0Test, TheScaleIsTheF32QuotientRoundedToF16) {
  std::array<float, kBlock> x = filled(0.25f);
  x[31] = -1.0f;  // amax 1: d = 1 / 127 = 0.007874016 in f32, 0x2008 in f16
  const BlockQ8_0 b = q8_of(x);
  EXPECT_EQ(b.d, 0x2008);
  EXPECT_EQ(b.qs[31], -127);
  EXPECT_EQ(b.qs[0], 32) << "0.25 * 127 = 31.75";
}

TEST(BlockQ8_0Test, ABlockTooSmallForTheReciprocalIsAllZeroCodes) {
  // d = 1e-40 / 127 is below 2^-128, so 1/d overflows: GGML's int8 conversion of inf is
  // undefined, x86 gives low byte 0; numesh writes those zero codes, under an f16 zero scale.
  std::array<float, kBlock> x = filled(1e-40f);
  x[1] = -1e-40f;
  const BlockQ8_0 b = q8_of(x);
  EXPECT_EQ(b.d, 0x0000);
  for (std::int8_t q : b.qs) EXPECT_EQ(q, 0);
  // Just above the overflow the reciprocal is finite and the codes are GGML's.
  x = filled(1e-36f);
  x[2] = -1e-36f;
  const BlockQ8_0 c = q8_of(x);
  EXPECT_EQ(c.d, 0x0000);
  EXPECT_EQ(c.qs[0], 127);
  EXPECT_EQ(c.qs[2], -127);
}

TEST(BlockQ8_0Test, AScaleBeyondF16IsStoredAsInfinityAsGgmlDoes) {
  std::array<float, kBlock> x = filled(1e9f);
  x[0] = 0.0f;
  const BlockQ8_0 b = q8_of(x);
  EXPECT_EQ(b.d, 0x7C00);
  EXPECT_EQ(b.qs[1], 127);
  EXPECT_EQ(b.qs[0], 0);
}

TEST(BlockQ8_0Test, DequantizationMultipliesTheCodeByTheWidenedScale) {
  std::array<BlockQ8_0, 2> b{};
  b[0].d = 0x3C00;  // 1
  b[1].d = 0xB800;  // -0.5
  for (std::size_t j = 0; j < kBlock; ++j) {
    b[0].qs[j] = static_cast<std::int8_t>(static_cast<int>(j) - 16);
    b[1].qs[j] = static_cast<std::int8_t>(127 - static_cast<int>(j));
  }
  std::vector<float> x(2 * kBlock);
  dequantize_q8_0(b, x);
  for (std::size_t j = 0; j < kBlock; ++j) {
    EXPECT_EQ(x[j], static_cast<float>(static_cast<int>(j) - 16));
    EXPECT_EQ(x[kBlock + j], -0.5f * static_cast<float>(127 - static_cast<int>(j)));
  }
}

TEST(BlockQ4_0Test, ZerosGiveANegativeZeroScaleAndCode8) {
  for (float zero : {0.0f, -0.0f}) {
    const BlockQ4_0 b = q4_of(filled(zero));
    EXPECT_EQ(b.d, 0x8000) << "GGML's max starts at +0, and +0 / -8 is -0";
    for (std::uint8_t byte : b.qs) EXPECT_EQ(byte, 0x88);
  }
}

TEST(BlockQ4_0Test, APositiveExtremeGivesANegativeScale) {
  std::array<float, kBlock> x{};
  x[0] = 8.0f;  // d = 8 / -8 = -1, id = -1: codes trunc(8.5 - x), at most 15
  x[1] = -8.0f;
  x[2] = 1.0f;
  x[3] = -1.0f;
  x[4] = 0.5f;   // 8.0: code 8
  x[5] = -0.5f;  // 9.0: code 9
  x[6] = 7.9f;
  const BlockQ4_0 b = q4_of(x);
  EXPECT_EQ(b.d, 0xBC00) << "f16 -1.0";
  const int want[] = {0, 15, 7, 9, 8, 9, 0, 8};
  for (std::size_t j = 0; j < std::size(want); ++j) EXPECT_EQ(q4_code(b, j), want[j]) << j;
}

TEST(BlockQ4_0Test, ANegativeExtremeGivesAPositiveScaleAndTheOppositeExtremeIsClamped) {
  std::array<float, kBlock> x{};
  x[0] = -8.0f;  // d = 1, id = 1: codes trunc(x + 8.5)
  x[1] = 8.0f;   // 16.5: 16, clamped to 15
  x[2] = 0.5f;   // 9.0
  x[3] = -0.5f;  // 8.0
  x[4] = 2.5f;   // 11.0
  x[5] = -7.9f;
  x[20] = 7.4f;  // 15.9: 15, in a high nibble
  const BlockQ4_0 b = q4_of(x);
  EXPECT_EQ(b.d, 0x3C00);
  const int want[] = {0, 15, 9, 8, 11, 0, 8};
  for (std::size_t j = 0; j < std::size(want); ++j) EXPECT_EQ(q4_code(b, j), want[j]) << j;
  EXPECT_EQ(q4_code(b, 20), 15);
}

TEST(BlockQ4_0Test, TheFirstOfEqualMagnitudesSetsTheScalesSign) {
  std::array<float, kBlock> x{};
  x[3] = 5.0f;
  x[9] = -5.0f;
  EXPECT_EQ(q4_of(x).d, f16_from_f32(-0.625f));
  EXPECT_EQ(q4_of(x).d, 0xB900);
  x[3] = -5.0f;
  x[9] = 5.0f;
  EXPECT_EQ(q4_of(x).d, 0x3900);
}

TEST(BlockQ4_0Test, ByteJHoldsCodeJLowAndCodeJPlus16High) {
  std::array<float, kBlock> x{};
  x[0] = -8.0f;  // d = 1: x = code - 8 gives code trunc(code + 0.5) = code
  for (std::size_t j = 1; j < 16; ++j) x[j] = static_cast<float>(j) - 8.0f;
  for (std::size_t j = 0; j < 16; ++j) x[16 + j] = 7.0f - static_cast<float>(j);  // 15 - j
  const BlockQ4_0 b = q4_of(x);
  EXPECT_EQ(b.d, 0x3C00);
  for (std::size_t j = 0; j < 16; ++j) {
    EXPECT_EQ(b.qs[j], static_cast<std::uint8_t>(j | ((15 - j) << 4))) << "byte " << j;
  }
}

TEST(BlockQ4_0Test, ABlockTooSmallForTheReciprocalIsAllCode0AsGgmlOnX86) {
  // |d| = 1.25e-41 <= 2^-128: 1/d overflows, and GGML's int8 conversion of x * inf + 8.5 is
  // undefined; x86 gives 0x80000000, low byte 0: code 0 everywhere, under an f16 -0 scale.
  std::array<float, kBlock> x = filled(1e-40f);
  x[4] = 0.0f;
  const BlockQ4_0 b = q4_of(x);
  EXPECT_EQ(b.d, 0x8000) << "a tiny negative scale rounds to f16 -0";
  for (std::uint8_t byte : b.qs) EXPECT_EQ(byte, 0x00);
  std::array<float, kBlock> back{};
  dequantize_q4_0(std::span<const BlockQ4_0>(&b, 1), back);
  for (float v : back) EXPECT_EQ(v, 0.0f);
  // 2^-125 / -8 = -2^-128 exactly, whose reciprocal overflows; one f32 step up, the quotient
  // still rounds to -2^-128; four steps up it is -(2^-128 + 2^-149), 1/d is finite and the
  // codes are GGML's defined ones.
  x = filled(0.0f);
  x[0] = std::ldexp(1.0f, -125);
  EXPECT_EQ(q4_of(x).qs[0], 0x00);
  x[0] = std::nextafter(std::ldexp(1.0f, -125), 1.0f);
  EXPECT_EQ(q4_of(x).qs[0], 0x00);
  x[0] = std::ldexp(1.0f, -125) + std::ldexp(1.0f, -146);
  EXPECT_EQ(q4_of(x).qs[0], 0x80) << "x[0] code 0, x[16] (zero) code 8";
}

TEST(BlockQ4_0Test, DequantizationIsCodeMinus8TimesTheWidenedScale) {
  BlockQ4_0 b{};
  b.d = 0x4000;  // 2
  for (std::size_t j = 0; j < 16; ++j) b.qs[j] = static_cast<std::uint8_t>(j | ((15 - j) << 4));
  std::array<float, kBlock> x{};
  dequantize_q4_0(std::span<const BlockQ4_0>(&b, 1), x);
  for (std::size_t j = 0; j < 16; ++j) {
    EXPECT_EQ(x[j], 2.0f * (static_cast<float>(j) - 8.0f)) << j;
    EXPECT_EQ(x[16 + j], 2.0f * (7.0f - static_cast<float>(j))) << j;
  }
}

TEST(BlockQ5_0Test, ZerosGiveANegativeZeroScaleAndCode16) {
  for (float zero : {0.0f, -0.0f}) {
    const BlockQ5_0 b = q5_of(filled(zero));
    EXPECT_EQ(b.d, 0x8000) << "GGML's max starts at +0, and +0 / -16 is -0";
    for (std::uint8_t byte : b.qs) EXPECT_EQ(byte, 0x00) << "code 16's low bits";
    for (std::uint8_t byte : b.qh) EXPECT_EQ(byte, 0xFF) << "code 16's fifth bit";
    std::array<float, kBlock> back{};
    dequantize_q5_0(std::span<const BlockQ5_0>(&b, 1), back);
    for (float v : back) EXPECT_EQ(v, 0.0f);
  }
}

TEST(BlockQ5_0Test, ANegativeExtremeGivesAPositiveScaleAndTheOppositeExtremeIsClamped) {
  std::array<float, kBlock> x{};
  x[0] = -16.0f;  // d = 1, id = 1: codes trunc(x + 16.5)
  x[1] = 16.0f;   // 32.5: 32, clamped to 31
  x[2] = 0.5f;    // 17.0
  x[3] = -0.5f;   // 16.0
  x[4] = 2.5f;    // 19.0
  x[5] = -15.9f;  // 0.6: 0
  x[20] = 14.4f;  // 30.9: 30, in a high nibble with its fifth bit
  x[31] = -1.0f;  // 15.5: 15, no fifth bit
  const BlockQ5_0 b = q5_of(x);
  EXPECT_EQ(b.d, 0x3C00);
  const int want[] = {0, 31, 17, 16, 19, 0, 16};
  for (std::size_t j = 0; j < std::size(want); ++j) EXPECT_EQ(q5_code(b, j), want[j]) << j;
  EXPECT_EQ(q5_code(b, 20), 30);
  EXPECT_EQ(q5_code(b, 31), 15);
  // And the mirror: a positive extreme gives a negative scale, codes trunc(16.5 - x).
  std::array<float, kBlock> y{};
  for (std::size_t j = 0; j < kBlock; ++j) y[j] = -x[j];
  const BlockQ5_0 c = q5_of(y);
  EXPECT_EQ(c.d, 0xBC00) << "f16 -1.0";
  for (std::size_t j = 0; j < kBlock; ++j) EXPECT_EQ(q5_code(c, j), q5_code(b, j)) << j;
}

TEST(BlockQ5_0Test, TheFifthBitsAreALittleEndianWordAfterTheScale) {
  std::array<float, kBlock> x{};
  std::array<int, kBlock> code{};
  for (std::size_t j = 0; j < kBlock; ++j) code[j] = static_cast<int>((j * 7 + 3) % 32);
  code[0] = 0;  // x = -16 sets d = 1, and x = code - 16 then gives code trunc(code + 0.5)
  for (std::size_t j = 0; j < kBlock; ++j) x[j] = static_cast<float>(code[j] - 16);
  const BlockQ5_0 b = q5_of(x);
  EXPECT_EQ(b.d, 0x3C00);
  std::uint32_t word = 0;
  for (std::size_t j = 0; j < kBlock; ++j) word |= static_cast<std::uint32_t>(code[j] >> 4) << j;
  unsigned char bytes[sizeof(BlockQ5_0)];
  std::memcpy(bytes, &b, sizeof bytes);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(bytes[2 + i], static_cast<unsigned char>(word >> (8 * i))) << "word byte " << i;
  }
  for (std::size_t j = 0; j < 16; ++j) {
    EXPECT_EQ(bytes[6 + j],
              static_cast<unsigned char>((code[j] & 0x0F) | ((code[j + 16] & 0x0F) << 4)))
        << "byte " << j;
  }
}

TEST(BlockQ5_0Test, ABlockTooSmallForTheReciprocalIsAllZeroBytesAsGgmlOnX86) {
  // |d| <= 2^-128: 1/d overflows, and GGML's int8 conversion of x * inf + 16.5 is undefined;
  // x86 gives 0x80000000, low byte 0: code 0 everywhere (no fifth bits), under an f16 -0 scale.
  std::array<float, kBlock> x = filled(1e-40f);
  x[4] = 0.0f;
  const BlockQ5_0 b = q5_of(x);
  EXPECT_EQ(b.d, 0x8000) << "a tiny negative scale rounds to f16 -0";
  for (std::uint8_t byte : b.qs) EXPECT_EQ(byte, 0x00);
  for (std::uint8_t byte : b.qh) EXPECT_EQ(byte, 0x00);
  std::array<float, kBlock> back{};
  dequantize_q5_0(std::span<const BlockQ5_0>(&b, 1), back);
  for (float v : back) EXPECT_EQ(v, 0.0f);
  // 2^-124 / -16 = -2^-128, whose reciprocal overflows; one f32 step up the quotient still
  // rounds to it; four steps up it is -(2^-128 + 2^-149), 1/d is finite and the zeros after
  // x[0] take code 16, their fifth bits set.
  x = filled(0.0f);
  x[0] = std::ldexp(1.0f, -124);
  EXPECT_EQ(q5_of(x).qh[2], 0x00);
  x[0] = std::nextafter(std::ldexp(1.0f, -124), 1.0f);
  EXPECT_EQ(q5_of(x).qh[2], 0x00);
  x[0] = std::ldexp(1.0f, -124) + std::ldexp(1.0f, -145);
  EXPECT_EQ(q5_code(q5_of(x), 0), 0);
  EXPECT_EQ(q5_of(x).qh[2], 0xFF) << "x[16 .. 23] (zeros) code 16";
}

TEST(BlockQ5_0Test, DequantizationIsCodeMinus16TimesTheWidenedScale) {
  BlockQ5_0 b{};
  b.d = 0x4000;  // 2
  for (std::size_t j = 0; j < 16; ++j) b.qs[j] = static_cast<std::uint8_t>(j | ((15 - j) << 4));
  const std::uint8_t qh[4] = {0xAA, 0x55, 0x0F, 0xF0};
  std::copy(std::begin(qh), std::end(qh), std::begin(b.qh));
  std::array<float, kBlock> x{};
  dequantize_q5_0(std::span<const BlockQ5_0>(&b, 1), x);
  for (std::size_t j = 0; j < kBlock; ++j) {
    const int nibble = j < 16 ? static_cast<int>(j) : 15 - static_cast<int>(j - 16);
    const int fifth = (qh[j / 8] >> (j % 8)) & 1;
    EXPECT_EQ(x[j], 2.0f * static_cast<float>((nibble | (fifth << 4)) - 16)) << j;
  }
}

// ---- IQ4_NL ----------------------------------------------------------------------------------

BlockIQ4_NL iq4_nl_of(const std::array<float, kBlock>& x) {
  BlockIQ4_NL b{};
  quantize_iq4_nl(x, std::span<BlockIQ4_NL>(&b, 1));
  return b;
}

std::array<float, kBlock> iq4_nl_back(const BlockIQ4_NL& b) {
  std::array<float, kBlock> back{};
  dequantize_iq4_nl(std::span<const BlockIQ4_NL>(&b, 1), back);
  return back;
}

TEST(BlockIQ4_NLTest, ZerosAndTinyBlocksHaveScaleZeroAndTheIndexOfOne) {
  // Below GGML's 1e-15 the scale is 0, and every index is the one nearest 0 * x: value 1 (index
  // 8, nearer 0 than -10).
  for (float v : {0.0f, -0.0f, 1e-16f, -9e-16f}) {
    const BlockIQ4_NL b = iq4_nl_of(filled(v));
    EXPECT_EQ(b.d, 0x0000) << v;
    for (std::uint8_t byte : b.qs) EXPECT_EQ(byte, 0x88) << v;
    for (float back : iq4_nl_back(b)) EXPECT_EQ(std::bit_cast<std::uint32_t>(back), 0u) << v;
  }
}

// Codebook values -127, 25 and 53 with zeros: the trial scale 1 (the extreme at -127) fits
// them exactly, where GGML's first guess (the extreme at +127, so at 113) cannot, so d is 1
// and the values come back as they were; each zero comes back as 1 (the codebook has no 0: its
// nearest value to 0 is 1). Negated, d is -1 with the same indices.
TEST(BlockIQ4_NLTest, CodebookValuesAreStoredExactlyAndZerosComeBackAsOneStep) {
  std::array<float, kBlock> x{};
  x[0] = -127.0f;
  x[1] = 25.0f;
  x[2] = 53.0f;
  for (float sign : {1.0f, -1.0f}) {
    std::array<float, kBlock> signed_x = x;
    for (float& v : signed_x) v = v * sign;
    const BlockIQ4_NL b = iq4_nl_of(signed_x);
    EXPECT_EQ(b.d, sign > 0 ? 0x3C00 : 0xBC00);
    EXPECT_EQ(b.qs[0], 0x80) << "index 0 (-127), and index 8 (1) for element 16";
    EXPECT_EQ(b.qs[1], 0x8A) << "index 10 (25)";
    EXPECT_EQ(b.qs[2], 0x8C) << "index 12 (53)";
    for (std::size_t j = 3; j < 16; ++j) EXPECT_EQ(b.qs[j], 0x88) << j;
    const std::array<float, kBlock> back = iq4_nl_back(b);
    for (std::size_t j = 0; j < kBlock; ++j) {
      EXPECT_EQ(back[j], j < 3 ? signed_x[j] : sign) << j;
    }
  }
}

TEST(BlockIQ4_NLTest, ByteJHoldsIndexJLowAndIndexJPlus16High) {
  std::array<float, kBlock> x{};
  x[0] = -127.0f;
  x[1] = 25.0f;
  x[2] = 53.0f;
  x[16] = 53.0f;
  x[17] = 25.0f;
  const BlockIQ4_NL b = iq4_nl_of(x);
  EXPECT_EQ(b.d, 0x3C00);
  EXPECT_EQ(b.qs[0], 0xC0) << "index 0 low, element 16's index 12 high";
  EXPECT_EQ(b.qs[1], 0xAA) << "index 10 for elements 1 and 17";
  EXPECT_EQ(b.qs[2], 0x8C) << "index 12 low, element 18's index 8 high";
}

TEST(BlockIQ4_NLTest, DequantizationIsTheWidenedScaleTimesTheCodebooksValue) {
  BlockIQ4_NL b{};
  b.d = f16_from_f32(-0.375f);
  for (std::size_t j = 0; j < 16; ++j) b.qs[j] = static_cast<std::uint8_t>(j | ((15 - j) << 4));
  const std::array<float, kBlock> back = iq4_nl_back(b);
  for (std::size_t j = 0; j < 16; ++j) {
    EXPECT_EQ(back[j], -0.375f * static_cast<float>(kIQ4_NLValues[j])) << j;
    EXPECT_EQ(back[j + 16], -0.375f * static_cast<float>(kIQ4_NLValues[15 - j])) << j;
  }
}

// Random rows: an element whose x / d lies within the codebook's range comes back within half
// its widest gap (24 between 89 and 113: 12 steps of d, plus the f16 rounding of d times 127);
// GGML's refit may leave a block's extreme beyond an end value, and then it is the end value.
// And the rows' RMS errors, as fractions of the rows' RMS, stay at a 4-bit level (at most 0.19
// on heavy tails in the NumPy transcription's runs). The rows' magnitudes keep d an f16 normal,
// whose rounding is relative (2^-11); a subnormal d's is absolute (up to 2^-25).
TEST(BlockIQ4_NLTest, RoundTripErrorIsBoundedByTheCodebooksGaps) {
  std::mt19937 rng(31);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::student_t_distribution<float> heavy(2.0f);
  for (int rows = 0; rows < 400; ++rows) {
    const float scale = std::pow(10.0f, static_cast<float>(rows % 5) - 1.0f);
    std::array<float, kBlock> x{};
    for (float& v : x) v = (rows % 2 == 0 ? normal(rng) : heavy(rng)) * scale;
    const BlockIQ4_NL b = iq4_nl_of(x);
    const float d = f32_from_f16(b.d);
    ASSERT_GE(std::fabs(d), 6.103515625e-5f) << "an f16 normal, row " << rows;
    const std::array<float, kBlock> back = iq4_nl_back(b);
    double error = 0.0, norm = 0.0;
    for (std::size_t j = 0; j < kBlock; ++j) {
      const float steps = x[j] / d;
      if (steps >= -126.0f && steps <= 112.0f) {
        EXPECT_LE(std::fabs(back[j] - x[j]), 12.2f * std::fabs(d)) << "row " << rows << " " << j;
      }
      error += (static_cast<double>(back[j]) - x[j]) * (static_cast<double>(back[j]) - x[j]);
      norm += static_cast<double>(x[j]) * x[j];
    }
    EXPECT_LE(std::sqrt(error / norm), 0.25) << "row " << rows;
  }
}

// Random rows at several magnitudes. The codes are within half a step of x / d (the f32 scale;
// q4_0's clamped opposite extreme within a whole step); the dequantized values add the f16
// rounding of the scale, at most 127 (q8_0) or 8 (q4_0) codes times |d - f16(d)|.
TEST(BlockFormatsTest, RoundTripErrorIsBoundedByTheScale) {
  std::mt19937 gen(20240601);
  for (float scale : {1e-3f, 1.0f, 300.0f}) {
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> x(64 * kBlock);
    for (float& v : x) v = dist(gen);
    std::vector<BlockQ8_0> q8(64);
    std::vector<BlockQ4_0> q4(64);
    std::vector<BlockQ5_0> q5(64);
    quantize_q8_0(x, q8);
    quantize_q4_0(x, q4);
    quantize_q5_0(x, q5);
    std::vector<float> y8(x.size()), y4(x.size()), y5(x.size());
    dequantize_q8_0(q8, y8);
    dequantize_q4_0(q4, y4);
    dequantize_q5_0(q5, y5);
    for (std::size_t b = 0; b < q8.size(); ++b) {
      float amax = 0.0f, max = 0.0f;
      for (std::size_t j = 0; j < kBlock; ++j) {
        if (amax < std::fabs(x[b * kBlock + j])) {
          amax = std::fabs(x[b * kBlock + j]);
          max = x[b * kBlock + j];
        }
      }
      const float d8 = amax / 127.0f, d4 = std::fabs(max / -8.0f), d5 = std::fabs(max / -16.0f);
      const float d8_error = std::fabs(d8 - f32_from_f16(q8[b].d));
      const float d4_error = std::fabs(d4 - std::fabs(f32_from_f16(q4[b].d)));
      const float d5_error = std::fabs(d5 - std::fabs(f32_from_f16(q5[b].d)));
      const float slack = 1.0f + 1e-4f;  // the f32 rounding of the checks themselves
      for (std::size_t j = 0; j < kBlock; ++j) {
        const std::size_t i = b * kBlock + j;
        const int c4 = q4_code(q4[b], j);
        const float q4_value = static_cast<float>(c4 - 8) * (max > 0 ? -d4 : d4);
        ASSERT_LE(std::fabs(x[i] - static_cast<float>(q8[b].qs[j]) * d8), 0.5f * d8 * slack)
            << "q8_0 code of element " << i << " at scale " << scale;
        ASSERT_LE(std::fabs(y8[i] - x[i]), (0.5f * d8 + 127.0f * d8_error) * slack) << i;
        const float step = c4 == 15 ? d4 : 0.5f * d4;  // 15 may be the clamped 16
        ASSERT_LE(std::fabs(x[i] - q4_value), step * slack)
            << "q4_0 code of element " << i << " at scale " << scale;
        ASSERT_LE(std::fabs(y4[i] - x[i]), (step + 8.0f * d4_error) * slack) << i;
        const int c5 = q5_code(q5[b], j);
        const float q5_value = static_cast<float>(c5 - 16) * (max > 0 ? -d5 : d5);
        const float step5 = c5 == 31 ? d5 : 0.5f * d5;  // 31 may be the clamped 32
        ASSERT_LE(std::fabs(x[i] - q5_value), step5 * slack)
            << "q5_0 code of element " << i << " at scale " << scale;
        ASSERT_LE(std::fabs(y5[i] - x[i]), (step5 + 16.0f * d5_error) * slack) << i;
      }
    }
  }
}

TEST(BlockFormatsTest, SizesThatAreNotThirtyTwoValuesABlockAreRefused) {
  std::vector<float> x(33);
  std::vector<BlockQ8_0> q8(1);
  std::vector<BlockQ4_0> q4(2);
  EXPECT_THAT([&] { quantize_q8_0(x, q8); },
              ThrowsMessage<ShapeError>(
                  HasSubstr("quantize q8_0: 33 values for 1 block(s) of 32: expected 32 values")));
  EXPECT_THAT([&] { quantize_q4_0(x, q4); },
              ThrowsMessage<ShapeError>(
                  HasSubstr("quantize q4_0: 33 values for 2 block(s) of 32: expected 64 values")));
  EXPECT_THAT([&] { dequantize_q8_0(q8, std::span<float>(x).first(31)); },
              ThrowsMessage<ShapeError>(HasSubstr(
                  "dequantize q8_0: 31 values for 1 block(s) of 32: expected 32 values")));
  EXPECT_THAT([&] { dequantize_q4_0(q4, x); },
              ThrowsMessage<ShapeError>(HasSubstr(
                  "dequantize q4_0: 33 values for 2 block(s) of 32: expected 64 values")));
  std::vector<BlockQ5_0> q5(1);
  EXPECT_THAT([&] { quantize_q5_0(x, q5); },
              ThrowsMessage<ShapeError>(
                  HasSubstr("quantize q5_0: 33 values for 1 block(s) of 32: expected 32 values")));
  EXPECT_THAT([&] { dequantize_q5_0(q5, x); },
              ThrowsMessage<ShapeError>(HasSubstr(
                  "dequantize q5_0: 33 values for 1 block(s) of 32: expected 32 values")));
  std::vector<BlockIQ4_NL> iq4(2);
  EXPECT_THAT([&] { quantize_iq4_nl(x, iq4); },
              ThrowsMessage<ShapeError>(HasSubstr(
                  "quantize iq4_nl: 33 values for 2 block(s) of 32: expected 64 values")));
  EXPECT_THAT([&] { dequantize_iq4_nl(iq4, x); },
              ThrowsMessage<ShapeError>(HasSubstr(
                  "dequantize iq4_nl: 33 values for 2 block(s) of 32: expected 64 values")));
  // Empty is whole blocks: nothing to do.
  EXPECT_NO_THROW(quantize_q8_0({}, {}));
  EXPECT_NO_THROW(dequantize_q4_0({}, {}));
}

TEST(BlockFormatsTest, NonFiniteValuesAreRefusedNamingTheFirst) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x(3 * kBlock, 1.0f);
  x[5] = nan;
  std::vector<BlockQ8_0> q8(3);
  std::vector<BlockQ4_0> q4(3);
  EXPECT_THAT([&] { quantize_q8_0(x, q8); },
              ThrowsMessage<ValueError>(HasSubstr("quantize q8_0: element 5 is nan")));
  EXPECT_THAT([&] { quantize_q4_0(x, q4); },
              ThrowsMessage<ValueError>(HasSubstr("quantize q4_0: element 5 is nan")));
  x[5] = 1.0f;
  x[40] = inf;
  x[41] = nan;
  EXPECT_THAT([&] { quantize_q8_0(x, q8); },
              ThrowsMessage<ValueError>(HasSubstr("quantize q8_0: element 40 is inf")));
  x[40] = -inf;
  EXPECT_THAT([&] { quantize_q4_0(x, q4); },
              ThrowsMessage<ValueError>(HasSubstr("quantize q4_0: element 40 is -inf")));
  std::vector<BlockQ5_0> q5(3);
  EXPECT_THAT([&] { quantize_q5_0(x, q5); },
              ThrowsMessage<ValueError>(HasSubstr("quantize q5_0: element 40 is -inf")));
  std::vector<BlockIQ4_NL> iq4(3);
  for (BlockIQ4_NL& b : iq4) b.d = 0xABCD;
  EXPECT_THAT([&] { quantize_iq4_nl(x, iq4); },
              ThrowsMessage<ValueError>(HasSubstr("quantize iq4_nl: element 40 is -inf")));
  EXPECT_NE(iq4[0].d, 0xABCD) << "the block before the bad one is written";
  EXPECT_EQ(iq4[1].d, 0xABCD);
  EXPECT_EQ(iq4[2].d, 0xABCD);

  // The blocks before the bad one are written; the bad one and those after are untouched.
  std::vector<BlockQ8_0> sentinel8(3);
  for (BlockQ8_0& b : sentinel8) b.d = 0xABCD;
  q8 = sentinel8;
  EXPECT_THROW(quantize_q8_0(x, q8), ValueError);
  EXPECT_EQ(q8[0].d, 0x2008);
  EXPECT_EQ(q8[0].qs[0], 127);
  EXPECT_EQ(q8[1].d, 0xABCD);
  EXPECT_EQ(q8[2].d, 0xABCD);
  std::vector<BlockQ4_0> sentinel4(3);
  for (BlockQ4_0& b : sentinel4) b.d = 0xABCD;
  q4 = sentinel4;
  EXPECT_THROW(quantize_q4_0(x, q4), ValueError);
  EXPECT_EQ(q4[0].d, f16_from_f32(-0.125f));
  EXPECT_EQ(q4[1].d, 0xABCD);
  EXPECT_EQ(q4[2].d, 0xABCD);
}

// ---- Q4_K and Q6_K --------------------------------------------------------------------------

constexpr std::size_t kSuper = 256;

BlockQ4_K q4k_of(std::span<const float> x) {
  BlockQ4_K b{};
  quantize_q4_k(x, std::span<BlockQ4_K>(&b, 1));
  return b;
}
BlockQ6_K q6k_of(std::span<const float> x) {
  BlockQ6_K b{};
  quantize_q6_k(x, std::span<BlockQ6_K>(&b, 1));
  return b;
}
std::vector<float> q4k_back(const BlockQ4_K& b) {
  std::vector<float> x(kSuper);
  dequantize_q4_k(std::span<const BlockQ4_K>(&b, 1), x);
  return x;
}
std::vector<float> q6k_back(const BlockQ6_K& b) {
  std::vector<float> x(kSuper);
  dequantize_q6_k(std::span<const BlockQ6_K>(&b, 1), x);
  return x;
}
// The 6-bit scale and minimum codes of Q4_K sub-block s, unpacked independently of the codec.
int q4k_scale_code(const BlockQ4_K& b, std::size_t s) {
  return s < 4 ? b.scales[s] & 63 : (b.scales[s + 4] & 0x0F) | ((b.scales[s - 4] >> 6) << 4);
}
int q4k_min_code(const BlockQ4_K& b, std::size_t s) {
  return s < 4 ? b.scales[s + 4] & 63 : (b.scales[s + 4] >> 4) | ((b.scales[s] >> 6) << 4);
}
template <typename Block>
bool all_bytes_zero(const Block& b) {
  unsigned char bytes[sizeof(Block)];
  std::memcpy(bytes, &b, sizeof(Block));
  return std::all_of(std::begin(bytes), std::end(bytes), [](unsigned char c) { return c == 0; });
}

TEST(BlockQ4_KTest, ZerosGiveAllZeroBytesAndDequantizeToPositiveZeros) {
  for (float zero : {0.0f, -0.0f}) {
    const std::vector<float> x(kSuper, zero);
    const BlockQ4_K b = q4k_of(x);
    EXPECT_TRUE(all_bytes_zero(b)) << "every sub-block is flat: scale 0, minimum -0, codes 0";
    for (float v : q4k_back(b)) {
      EXPECT_EQ(v, 0.0f);
      EXPECT_FALSE(std::signbit(v)) << "0 * 0 - 0 * 0 is +0";
    }
  }
}

TEST(BlockQ4_KTest, AConstantNegativeRowIsAllMinimum) {
  // Each sub-block is flat at -2 <= 0: make_qkx2_quants gives scale 0 and minimum 2, so every
  // scale code is 0 (d = f16 0), every minimum code 63 against dmin = f16(2 / 63), and the final
  // pass skips every sub-block (its d is 0), keeping the search's codes 0.
  const std::vector<float> x(kSuper, -2.0f);
  const BlockQ4_K b = q4k_of(x);
  EXPECT_EQ(b.d, 0x0000);
  EXPECT_EQ(b.dmin, f16_from_f32(2.0f / 63.0f));
  EXPECT_EQ(b.dmin, 0x2810);
  const std::uint8_t want_scales[12] = {0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0xF0, 0xF0, 0xF0, 0xF0};
  for (std::size_t i = 0; i < 12; ++i) EXPECT_EQ(b.scales[i], want_scales[i]) << "byte " << i;
  for (std::size_t s = 0; s < 8; ++s) {
    EXPECT_EQ(q4k_scale_code(b, s), 0);
    EXPECT_EQ(q4k_min_code(b, s), 63);
  }
  for (std::uint8_t byte : b.qs) EXPECT_EQ(byte, 0x00);
  for (float v : q4k_back(b)) EXPECT_EQ(v, -(f32_from_f16(0x2810) * 63.0f));
}

TEST(BlockQ4_KTest, AConstantPositiveRowIsAllTopCode) {
  // The minimum is clamped to 0, so the range is [0, 3]: scale 3 / 15 = 0.2 with zero error (no
  // trial is strictly better), scale codes 63 against d = f16(0.2 / 63), minimum codes 0.
  const std::vector<float> x(kSuper, 3.0f);
  const BlockQ4_K b = q4k_of(x);
  EXPECT_EQ(b.d, f16_from_f32(0.2f / 63.0f));
  EXPECT_EQ(b.d, 0x1A80);
  EXPECT_EQ(b.dmin, 0x0000);
  const std::uint8_t want_scales[12] = {0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0, 0x0F, 0x0F, 0x0F, 0x0F};
  for (std::size_t i = 0; i < 12; ++i) EXPECT_EQ(b.scales[i], want_scales[i]) << "byte " << i;
  for (std::uint8_t byte : b.qs) EXPECT_EQ(byte, 0xFF);
  for (float v : q4k_back(b)) EXPECT_EQ(v, f32_from_f16(0x1A80) * 63.0f * 15.0f);
}

TEST(BlockQ4_KTest, DequantizationReadsGgmlsLayout) {
  // Distinct codes everywhere: sub-block s has scale code 10 + 6 s and minimum code 60 - 7 s
  // (both > 15 for some s >= 4, so the high 2 bits matter), and element i code i % 16.
  BlockQ4_K b{};
  b.d = 0x3C00;     // 1
  b.dmin = 0x3800;  // 0.5
  for (std::size_t s = 0; s < 8; ++s) {
    const auto sc = static_cast<std::uint8_t>(10 + 6 * s);
    const auto m = static_cast<std::uint8_t>(60 - 7 * s);
    if (s < 4) {
      b.scales[s] = static_cast<std::uint8_t>(b.scales[s] | sc);
      b.scales[s + 4] = static_cast<std::uint8_t>(b.scales[s + 4] | m);
    } else {
      b.scales[s + 4] = static_cast<std::uint8_t>((sc & 0x0F) | ((m & 0x0F) << 4));
      b.scales[s - 4] = static_cast<std::uint8_t>(b.scales[s - 4] | ((sc >> 4) << 6));
      b.scales[s] = static_cast<std::uint8_t>(b.scales[s] | ((m >> 4) << 6));
    }
  }
  for (std::size_t c = 0; c < 4; ++c) {
    for (std::size_t l = 0; l < 32; ++l) {
      const std::size_t low = 64 * c + l, high = 64 * c + 32 + l;
      b.qs[32 * c + l] = static_cast<std::uint8_t>((low % 16) | ((high % 16) << 4));
    }
  }
  const std::vector<float> x = q4k_back(b);
  for (std::size_t i = 0; i < kSuper; ++i) {
    const std::size_t s = i / 32;
    const float want = static_cast<float>(10 + 6 * s) * static_cast<float>(i % 16) -
                       0.5f * static_cast<float>(60 - 7 * s);
    ASSERT_EQ(x[i], want) << "element " << i;
  }
}

TEST(BlockQ6_KTest, ZerosGiveAllZeroBytesThatDequantizeToNegativeZeros) {
  for (float zero : {0.0f, -0.0f}) {
    const std::vector<float> x(kSuper, zero);
    const BlockQ6_K b = q6k_of(x);
    EXPECT_TRUE(all_bytes_zero(b)) << "GGML's memset for a block below 1e-15";
    for (float v : q6k_back(b)) {
      EXPECT_EQ(v, 0.0f);
      EXPECT_TRUE(std::signbit(v)) << "code 0 is -32, and 0 * 0 * -32 is -0";
    }
  }
  // Below GGML's 1e-15 the same, whatever the values: every sub-block's scale is "zero".
  std::vector<float> x(kSuper, 5e-16f);
  x[17] = -9e-16f;
  EXPECT_TRUE(all_bytes_zero(q6k_of(x)));
}

TEST(BlockQ6_KTest, ASingleNonZeroIsExactAndZeroSubBlocksKeepTheSearchsCodes) {
  // Sub-block 0 is [1, 0, ...]: make_qx_quants codes 1 as -32 (iscale = -32) and the weighted
  // fit gives scale -1/32; no trial explains more. The other 15 sub-blocks are zero: scale 0,
  // codes 0 (stored 0, not 32). d = f16(1 / (-128 / (-1/32))) = 2^-12, sub-block 0's code -128,
  // the others' 0, so the final pass skips them and keeps the stored 0.
  std::vector<float> x(kSuper, 0.0f);
  x[0] = 1.0f;
  const BlockQ6_K b = q6k_of(x);
  EXPECT_EQ(b.d, 0x0C00) << "f16 2^-12";
  EXPECT_EQ(b.scales[0], -128);
  for (std::size_t g = 1; g < 16; ++g) EXPECT_EQ(b.scales[g], 0) << g;
  // Codes: element 0 is 0 (-32), elements 1 .. 15 are 32 (0), the rest 0. Only 32's high bits
  // (2) show, in qh bytes 1 .. 15.
  for (std::uint8_t byte : b.ql) EXPECT_EQ(byte, 0x00);
  for (std::size_t l = 0; l < 64; ++l) EXPECT_EQ(b.qh[l], l >= 1 && l < 16 ? 2 : 0) << l;
  const std::vector<float> back = q6k_back(b);
  EXPECT_EQ(back[0], 1.0f) << "2^-12 * -128 * -32";
  for (std::size_t i = 1; i < kSuper; ++i) {
    EXPECT_EQ(back[i], 0.0f);
    EXPECT_TRUE(std::signbit(back[i])) << i;
  }
}

TEST(BlockQ6_KTest, DequantizationReadsGgmlsLayout) {
  // Element i (within its half, e = i % 128) gets code (i * 7) % 64; sub-block g scale code
  // g * 16 - 128 (-128 .. 112).
  BlockQ6_K b{};
  b.d = 0x3800;  // 0.5
  for (std::size_t g = 0; g < 16; ++g) {
    b.scales[g] = static_cast<std::int8_t>(static_cast<int>(g) * 16 - 128);
  }
  auto code = [](std::size_t i) { return static_cast<int>((i * 7) % 64); };
  for (std::size_t h = 0; h < 2; ++h) {
    for (std::size_t l = 0; l < 32; ++l) {
      const std::size_t e = 128 * h + l;
      b.ql[64 * h + l] = static_cast<std::uint8_t>((code(e) & 0xF) | ((code(e + 64) & 0xF) << 4));
      b.ql[64 * h + 32 + l] =
          static_cast<std::uint8_t>((code(e + 32) & 0xF) | ((code(e + 96) & 0xF) << 4));
      b.qh[32 * h + l] =
          static_cast<std::uint8_t>((code(e) >> 4) | ((code(e + 32) >> 4) << 2) |
                                    ((code(e + 64) >> 4) << 4) | ((code(e + 96) >> 4) << 6));
    }
  }
  const std::vector<float> x = q6k_back(b);
  for (std::size_t i = 0; i < kSuper; ++i) {
    const float want = 0.5f * static_cast<float>(static_cast<int>(i / 16) * 16 - 128) *
                       static_cast<float>(code(i) - 32);
    ASSERT_EQ(x[i], want) << "element " << i;
  }
}

// One outlier among small values: its sub-block is coded around it, so it comes back within half
// a step of that sub-block; the other sub-blocks' scales are tiny against the outlier's and code
// to 0 or a few steps (GGML's format: 6- or 8-bit sub-block scales under one f16), so they only
// stay within the bounds of RoundTripErrorIsBoundedByTheSuperBlockScales.
TEST(BlockKQuantsTest, AnOutlierIsKeptWithinHalfAStepOfItsSubBlock) {
  std::mt19937 gen(7);
  std::normal_distribution<float> dist(0.0f, 0.01f);
  std::vector<float> x(kSuper);
  for (float& v : x) v = dist(gen);
  x[100] = 50.0f;
  const BlockQ4_K b4 = q4k_of(x);
  const float d4 = f32_from_f16(b4.d) * static_cast<float>(q4k_scale_code(b4, 100 / 32));
  EXPECT_EQ(q4k_scale_code(b4, 100 / 32), 63) << "the outlier's sub-block has the largest scale";
  EXPECT_LE(std::fabs(q4k_back(b4)[100] - 50.0f), 0.5f * d4);
  const BlockQ6_K b6 = q6k_of(x);
  EXPECT_EQ(b6.scales[100 / 16], -128) << "its scale is the largest in magnitude: code -128";
  const float d6 = std::fabs(f32_from_f16(b6.d) * 128.0f);
  EXPECT_LE(std::fabs(q6k_back(b6)[100] - 50.0f), 0.5f * d6);
  EXPECT_NEAR(q6k_back(b6)[100], 50.0f, 50.0f * 2e-3f) << "f16 d and the fit, not more";
}

// Random rows. Q4_K: within a sub-block of range r (max - min(0, min)), the codes cover the
// range in 14 .. 16 steps of the fitted scale (some elements may be clamped by a step), and the
// stored scale and minimum are off by at most half a 6-bit code (d / 2, 15 codes of it) and
// dmin / 2: |x - y| <= r / 15 + 8 d + dmin / 2. Q6_K: the codes span the sub-block's largest
// magnitude a in 32 steps, and the scale's 8-bit code is off by half a code (d / 2, 32 codes of
// it): |x - y| <= a / 32 + 16 |d| (with d an f16 normal: a subnormal d adds its own rounding).
// And the whole rows' RMS errors, as fractions of the rows' RMS, stay at 4- and 6-bit levels.
TEST(BlockKQuantsTest, RoundTripErrorIsBoundedByTheSuperBlockScales) {
  std::mt19937 gen(20240602);
  for (float scale : {0.5f, 1.0f, 300.0f}) {
    std::normal_distribution<float> dist(0.0f, scale);
    constexpr std::size_t kBlocks = 64;
    std::vector<float> x(kBlocks * kSuper);
    for (float& v : x) v = dist(gen);
    std::vector<BlockQ4_K> q4(kBlocks);
    std::vector<BlockQ6_K> q6(kBlocks);
    quantize_q4_k(x, q4);
    quantize_q6_k(x, q6);
    std::vector<float> y4(x.size()), y6(x.size());
    dequantize_q4_k(q4, y4);
    dequantize_q6_k(q6, y6);
    const float slack = 1.0f + 1e-4f;
    for (std::size_t b = 0; b < kBlocks; ++b) {
      const float d4 = f32_from_f16(q4[b].d), dmin4 = f32_from_f16(q4[b].dmin);
      const float d6 = std::fabs(f32_from_f16(q6[b].d));
      ASSERT_GE(d6, 6.103515625e-05f) << "an f16 normal, for the bound";
      double sum_x2 = 0, err4 = 0, err6 = 0;
      for (std::size_t s = 0; s < 8; ++s) {
        const float* sub = x.data() + b * kSuper + 32 * s;
        const float lo = std::min(0.0f, *std::min_element(sub, sub + 32));
        const float range = *std::max_element(sub, sub + 32) - lo;
        for (std::size_t i = 0; i < 32; ++i) {
          const std::size_t k = b * kSuper + 32 * s + i;
          ASSERT_LE(std::fabs(y4[k] - x[k]), (range / 15.0f + 8.0f * d4 + 0.5f * dmin4) * slack)
              << "q4_k element " << k << " at scale " << scale;
        }
      }
      for (std::size_t g = 0; g < 16; ++g) {
        const float* sub = x.data() + b * kSuper + 16 * g;
        float amax = 0.0f;
        for (std::size_t i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(sub[i]));
        for (std::size_t i = 0; i < 16; ++i) {
          const std::size_t k = b * kSuper + 16 * g + i;
          ASSERT_LE(std::fabs(y6[k] - x[k]), (amax / 32.0f + 16.0f * d6) * slack)
              << "q6_k element " << k << " at scale " << scale;
        }
      }
      for (std::size_t i = 0; i < kSuper; ++i) {
        const std::size_t k = b * kSuper + i;
        sum_x2 += double{x[k]} * x[k];
        err4 += double{y4[k] - x[k]} * (y4[k] - x[k]);
        err6 += double{y6[k] - x[k]} * (y6[k] - x[k]);
      }
      EXPECT_LT(std::sqrt(err4 / sum_x2), 0.1) << "q4_k block " << b << " at scale " << scale;
      EXPECT_LT(std::sqrt(err6 / sum_x2), 0.03) << "q6_k block " << b << " at scale " << scale;
    }
  }
}

TEST(BlockKQuantsTest, SizesThatAreNotWholeSuperBlocksAreRefused) {
  std::vector<float> x(257);
  std::vector<BlockQ4_K> q4(1);
  std::vector<BlockQ6_K> q6(2);
  EXPECT_THAT([&] { quantize_q4_k(x, q4); },
              ThrowsMessage<ShapeError>(HasSubstr(
                  "quantize q4_k: 257 values for 1 block(s) of 256: expected 256 values")));
  EXPECT_THAT([&] { quantize_q6_k(x, q6); },
              ThrowsMessage<ShapeError>(HasSubstr(
                  "quantize q6_k: 257 values for 2 block(s) of 256: expected 512 values")));
  EXPECT_THAT([&] { dequantize_q4_k(q4, std::span<float>(x).first(255)); },
              ThrowsMessage<ShapeError>(HasSubstr(
                  "dequantize q4_k: 255 values for 1 block(s) of 256: expected 256 values")));
  EXPECT_THAT([&] { dequantize_q6_k(q6, x); },
              ThrowsMessage<ShapeError>(HasSubstr(
                  "dequantize q6_k: 257 values for 2 block(s) of 256: expected 512 values")));
  EXPECT_NO_THROW(quantize_q4_k({}, {}));
  EXPECT_NO_THROW(dequantize_q6_k({}, {}));
}

TEST(BlockKQuantsTest, NonFiniteValuesAreRefusedNamingTheFirst) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x(3 * kSuper, 1.0f);
  x[255] = nan;  // the last element of block 0: GGML's search would carry NaN into its sums
  std::vector<BlockQ4_K> q4(3);
  std::vector<BlockQ6_K> q6(3);
  EXPECT_THAT([&] { quantize_q4_k(x, q4); },
              ThrowsMessage<ValueError>(HasSubstr("quantize q4_k: element 255 is nan")));
  EXPECT_THAT([&] { quantize_q6_k(x, q6); },
              ThrowsMessage<ValueError>(HasSubstr("quantize q6_k: element 255 is nan")));
  x[255] = 1.0f;
  x[300] = -inf;
  x[301] = nan;
  EXPECT_THAT([&] { quantize_q4_k(x, q4); },
              ThrowsMessage<ValueError>(HasSubstr("quantize q4_k: element 300 is -inf")));
  x[300] = inf;
  EXPECT_THAT([&] { quantize_q6_k(x, q6); },
              ThrowsMessage<ValueError>(HasSubstr("quantize q6_k: element 300 is inf")));

  // The blocks before the bad one are written; the bad one and those after are untouched.
  std::vector<BlockQ4_K> sentinel4(3);
  for (BlockQ4_K& b : sentinel4) b.d = 0xABCD;
  q4 = sentinel4;
  EXPECT_THROW(quantize_q4_k(x, q4), ValueError);
  EXPECT_EQ(q4[0].d, f16_from_f32((1.0f / 15.0f) / 63.0f)) << "block 0 is 256 ones: scale 1/15";
  EXPECT_EQ(q4[0].qs[0], 0xFF);
  EXPECT_EQ(q4[1].d, 0xABCD);
  EXPECT_EQ(q4[2].d, 0xABCD);
  std::vector<BlockQ6_K> sentinel6(3);
  for (BlockQ6_K& b : sentinel6) b.d = 0xABCD;
  q6 = sentinel6;
  EXPECT_THROW(quantize_q6_k(x, q6), ValueError);
  EXPECT_NE(q6[0].d, 0xABCD);
  EXPECT_EQ(q6[0].scales[0], -128);
  EXPECT_EQ(q6[1].d, 0xABCD);
  EXPECT_EQ(q6[2].d, 0xABCD);
}

// ---- IQ4_XS -------------------------------------------------------------------------------

BlockIQ4_XS iq4_xs_of(const std::vector<float>& x) {
  BlockIQ4_XS b{};
  quantize_iq4_xs(x, std::span<BlockIQ4_XS>(&b, 1));
  return b;
}

std::vector<float> iq4_xs_back(const BlockIQ4_XS& b) {
  std::vector<float> back(kSuper);
  dequantize_iq4_xs(std::span<const BlockIQ4_XS>(&b, 1), back);
  return back;
}

// Sub-block g's 6-bit scale code (0 .. 63), unpacked apart from the codec.
int iq4_xs_code(const BlockIQ4_XS& b, std::size_t g) {
  return ((b.scales_l[g / 2] >> (4 * (g % 2))) & 0x0F) | (((b.scales_h >> (2 * g)) & 3) << 4);
}

// All sub-block scales 0: d = -0 / 32 is -0 (f16 0x8000), each scale code 32 (a scale of 0), each
// index 8 (the value nearest 0 * x); the block dequantizes to -0 (d times 0 is -0).
TEST(BlockIQ4_XSTest, ZerosGiveNegativeZeroDScaleCode32AndIndex8) {
  for (float zero : {0.0f, -0.0f}) {
    const BlockIQ4_XS b = iq4_xs_of(std::vector<float>(kSuper, zero));
    EXPECT_EQ(b.d, 0x8000);
    EXPECT_EQ(b.scales_h, 0xAAAA) << "code 32's high bits, 2, in every pair";
    for (std::uint8_t byte : b.scales_l) EXPECT_EQ(byte, 0x00);
    for (std::uint8_t byte : b.qs) EXPECT_EQ(byte, 0x88);
    for (float v : iq4_xs_back(b)) EXPECT_EQ(std::bit_cast<std::uint32_t>(v), 0x80000000u);
  }
}

// Sub-block 0 holds codebook values (its search's scale is 1, IQ4_NL's
// CodebookValuesAreStoredExactly...), the others zeros (scale 0): d = 1 / -32 (f16 exact),
// sub-block 0's code nearest_int(-32 * 1) = -32, stored 0, so its coded scale is d * -32 = 1 and
// its values come back exactly; the zero sub-blocks' code 0, stored 32, a coded scale of -0.
TEST(BlockIQ4_XSTest, ALargestSubBlockScaleIsCodeMinus32AndComesBackExactly) {
  std::vector<float> x(kSuper, 0.0f);
  x[0] = -127.0f;
  x[1] = 25.0f;
  x[2] = 53.0f;
  const BlockIQ4_XS b = iq4_xs_of(x);
  EXPECT_EQ(b.d, f16_from_f32(-1.0f / 32.0f));
  EXPECT_EQ(iq4_xs_code(b, 0), 0);
  for (std::size_t g = 1; g < 8; ++g) EXPECT_EQ(iq4_xs_code(b, g), 32) << g;
  EXPECT_EQ(b.scales_h, 0xAAA8);
  EXPECT_EQ(b.qs[0], 0x80);
  EXPECT_EQ(b.qs[1], 0x8A);
  EXPECT_EQ(b.qs[2], 0x8C);
  const std::vector<float> back = iq4_xs_back(b);
  EXPECT_EQ(back[0], -127.0f);
  EXPECT_EQ(back[1], 25.0f);
  EXPECT_EQ(back[2], 53.0f);
  for (std::size_t j = 3; j < 32; ++j) EXPECT_EQ(back[j], 1.0f) << "a zero among values, " << j;
  for (std::size_t j = 32; j < kSuper; ++j) {
    EXPECT_EQ(std::bit_cast<std::uint32_t>(back[j]), 0x80000000u) << j;
  }
}

TEST(BlockIQ4_XSTest, DequantizationReadsGgmlsLayout) {
  BlockIQ4_XS b{};
  b.d = f16_from_f32(0.5f);
  // Codes 32 + g - 4 (scales -4 .. 3): low nibbles g + 28 mod 16, high bits 1 or 2.
  b.scales_h = 0;
  for (std::size_t g = 0; g < 8; ++g) {
    const unsigned code = static_cast<unsigned>(28 + g);
    b.scales_l[g / 2] =
        static_cast<std::uint8_t>(b.scales_l[g / 2] | ((code & 0x0F) << (4 * (g % 2))));
    b.scales_h = static_cast<std::uint16_t>(b.scales_h | ((code >> 4) << (2 * g)));
  }
  for (std::size_t i = 0; i < 128; ++i)
    b.qs[i] = static_cast<std::uint8_t>((i % 16) | ((15 - i % 16) << 4));
  const std::vector<float> back = iq4_xs_back(b);
  for (std::size_t g = 0; g < 8; ++g) {
    ASSERT_EQ(iq4_xs_code(b, g), static_cast<int>(28 + g));
    const float dl = 0.5f * static_cast<float>(static_cast<int>(g) - 4);
    for (std::size_t j = 0; j < 16; ++j) {
      EXPECT_EQ(back[32 * g + j], dl * static_cast<float>(kIQ4_NLValues[j])) << g << " " << j;
      EXPECT_EQ(back[32 * g + 16 + j], dl * static_cast<float>(kIQ4_NLValues[15 - j]))
          << g << " " << j;
    }
  }
}

// Random rows: within a sub-block whose coded scale s = d (sc - 32) is not 0, an element whose
// x / s lies within the codebook's range comes back within half its widest gap (12 steps of s,
// plus the f16 rounding of d times 32 * 127), and the rows' RMS errors stay at a 4-bit level.
// The rows' magnitudes keep d an f16 normal: a subnormal d is rounded by up to several percent,
// and the indices, chosen against the f32 scale, then miss the stored one by more.
TEST(BlockIQ4_XSTest, RoundTripErrorIsBoundedByTheCodedScales) {
  std::mt19937 rng(37);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int rows = 0; rows < 100; ++rows) {
    const float scale = std::pow(10.0f, static_cast<float>(rows % 4));
    std::vector<float> x(kSuper);
    for (float& v : x) v = normal(rng) * scale;
    const BlockIQ4_XS b = iq4_xs_of(x);
    const std::vector<float> back = iq4_xs_back(b);
    const float d = f32_from_f16(b.d);
    ASSERT_GE(std::fabs(d), 6.103515625e-5f) << "an f16 normal, row " << rows;
    double error = 0.0, norm = 0.0;
    for (std::size_t i = 0; i < kSuper; ++i) {
      const float s = d * static_cast<float>(iq4_xs_code(b, i / 32) - 32);
      const float steps = s != 0.0f ? x[i] / s : 1e9f;
      if (steps >= -126.0f && steps <= 112.0f) {
        EXPECT_LE(std::fabs(back[i] - x[i]), 12.0f * std::fabs(s) + 3.0f * std::fabs(d))
            << "row " << rows << " element " << i;
      }
      error += (static_cast<double>(back[i]) - x[i]) * (static_cast<double>(back[i]) - x[i]);
      norm += static_cast<double>(x[i]) * x[i];
    }
    EXPECT_LE(std::sqrt(error / norm), 0.2) << "row " << rows;
  }
}

TEST(BlockIQ4_XSTest, BadSizesAndNonFiniteValuesAreRefusedByName) {
  std::vector<float> x(257, 1.0f);
  std::vector<BlockIQ4_XS> blocks(1);
  EXPECT_THAT([&] { quantize_iq4_xs(x, blocks); },
              ThrowsMessage<ShapeError>(HasSubstr(
                  "quantize iq4_xs: 257 values for 1 block(s) of 256: expected 256 values")));
  EXPECT_THAT([&] { dequantize_iq4_xs(blocks, x); },
              ThrowsMessage<ShapeError>(HasSubstr(
                  "dequantize iq4_xs: 257 values for 1 block(s) of 256: expected 256 values")));
  std::vector<float> y(512, 1.0f);
  y[300] = -std::numeric_limits<float>::infinity();
  std::vector<BlockIQ4_XS> two(2);
  two[1].d = 0xABCD;
  EXPECT_THAT([&] { quantize_iq4_xs(y, two); },
              ThrowsMessage<ValueError>(HasSubstr("quantize iq4_xs: element 300 is -inf")));
  EXPECT_NE(two[0].d, 0) << "the block before the bad one is written";
  EXPECT_EQ(two[1].d, 0xABCD);
}

// ---- Q3_K ---------------------------------------------------------------------------------

BlockQ3_K q3k_of(std::span<const float> x) {
  BlockQ3_K b{};
  quantize_q3_k(x, std::span<BlockQ3_K>(&b, 1));
  return b;
}
std::vector<float> q3k_back(const BlockQ3_K& b) {
  std::vector<float> x(kSuper);
  dequantize_q3_k(std::span<const BlockQ3_K>(&b, 1), x);
  return x;
}
// Sub-block g's 6-bit scale code and element e's 3-bit code, unpacked apart from the codec.
int q3k_scale_code(const BlockQ3_K& b, std::size_t g) {
  const int nibble = g < 8 ? b.scales[g] & 0x0F : b.scales[g - 8] >> 4;
  return nibble | (((b.scales[8 + g % 4] >> (2 * (g / 4))) & 3) << 4);
}
int q3k_code(const BlockQ3_K& b, std::size_t e) {
  return ((b.qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3) |
         (((b.hmask[e % 32] >> (e / 32)) & 1) << 2);
}

TEST(BlockQ3_KTest, ZerosGiveAllZeroBytesThatDequantizeToPositiveZeros) {
  for (float zero : {0.0f, -0.0f}) {
    const std::vector<float> x(kSuper, zero);
    const BlockQ3_K b = q3k_of(x);
    EXPECT_TRUE(all_bytes_zero(b)) << "every sub-block below 1e-15: codes 0, scale codes 0, d 0";
    for (float v : q3k_back(b)) {
      EXPECT_EQ(v, 0.0f);
      EXPECT_FALSE(std::signbit(v)) << "0 * (0 - 32) is -0, times code 0 (-4) +0";
    }
  }
}

TEST(BlockQ3_KTest, ASingleNonZeroIsExactAndZeroSubBlocksKeepTheSearchsCodes) {
  // Sub-block 0 is [1, 0, ...]: make_q3_quants codes 1 as -4 (iscale = -4), the zeros as 0, and
  // the fit gives scale -4 / 16; no move explains more. The other 15 sub-blocks are zero: scale
  // 0, codes 0 (stored 0, that is -4). iscale = -32 / -0.25 = 128: sub-block 0's scale code
  // -32 (stored 0), the others' 0 (stored 32), d = f16(1 / 128). The final pass re-rounds
  // sub-block 0 (1 / -0.25 = -4, 0 / -0.25 = 0) and skips the others (d (32 - 32) = 0).
  std::vector<float> x(kSuper, 0.0f);
  x[0] = 1.0f;
  const BlockQ3_K b = q3k_of(x);
  EXPECT_EQ(b.d, 0x2000) << "f16 2^-7";
  EXPECT_EQ(q3k_scale_code(b, 0), 0);
  for (std::size_t g = 1; g < 16; ++g) EXPECT_EQ(q3k_scale_code(b, g), 32) << g;
  // Stored 32 is 0b100000: only its two high bits show, in bytes 8 .. 11.
  const std::uint8_t scales[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0xA8, 0xAA, 0xAA, 0xAA};
  for (std::size_t i = 0; i < 12; ++i) EXPECT_EQ(b.scales[i], scales[i]) << i;
  for (std::size_t e = 0; e < kSuper; ++e) EXPECT_EQ(q3k_code(b, e), e >= 1 && e < 16 ? 4 : 0) << e;
  const std::vector<float> back = q3k_back(b);
  EXPECT_EQ(back[0], 1.0f) << "2^-7 * -32 * -4";
  for (std::size_t i = 1; i < kSuper; ++i) {
    EXPECT_EQ(back[i], 0.0f);
    EXPECT_TRUE(std::signbit(back[i])) << i;
  }
}

TEST(BlockQ3_KTest, DequantizationReadsGgmlsLayout) {
  // Element e gets code (e * 5) % 8; sub-block g scale code (g * 4 + 3) % 64.
  BlockQ3_K b{};
  b.d = 0x3800;  // 0.5
  auto code = [](std::size_t e) { return static_cast<int>((e * 5) % 8); };
  auto scale = [](std::size_t g) { return static_cast<int>((g * 4 + 3) % 64); };
  for (std::size_t g = 0; g < 16; ++g) {
    b.scales[g % 8] |= static_cast<std::uint8_t>((scale(g) & 0x0F) << (g < 8 ? 0 : 4));
    b.scales[8 + g % 4] |= static_cast<std::uint8_t>((scale(g) >> 4) << (2 * (g / 4)));
  }
  for (std::size_t e = 0; e < kSuper; ++e) {
    b.qs[32 * (e / 128) + e % 32] |=
        static_cast<std::uint8_t>((code(e) & 3) << (2 * (e % 128 / 32)));
    b.hmask[e % 32] |= static_cast<std::uint8_t>((code(e) >> 2) << (e / 32));
  }
  const std::vector<float> x = q3k_back(b);
  for (std::size_t e = 0; e < kSuper; ++e) {
    const float want =
        0.5f * static_cast<float>(scale(e / 16) - 32) * static_cast<float>(code(e) - 4);
    ASSERT_EQ(x[e], want) << "element " << e;
  }
}

// Random rows: each sub-block's codes span its largest magnitude a in 4 steps, one of them
// clamped, and the scale's 6-bit code is off by up to half a code: |x - y| <= a / 4 + 4 |d|
// (within 0.87-0.89 of it on these rows). The RMS error of a block stays at a 3-bit level.
TEST(BlockQ3_KTest, RoundTripErrorIsBoundedByTheSubBlockScales) {
  std::mt19937 gen(20241205);
  for (float spread : {0.5f, 1.0f, 300.0f}) {
    std::normal_distribution<float> dist(0.0f, spread);
    constexpr std::size_t kBlocks = 64;
    std::vector<float> x(kBlocks * kSuper);
    for (float& v : x) v = dist(gen);
    std::vector<BlockQ3_K> q(kBlocks);
    quantize_q3_k(x, q);
    std::vector<float> y(x.size());
    dequantize_q3_k(q, y);
    for (std::size_t b = 0; b < kBlocks; ++b) {
      const float d = std::fabs(f32_from_f16(q[b].d));
      double sum_x2 = 0, err = 0;
      for (std::size_t g = 0; g < 16; ++g) {
        const float* sub = x.data() + b * kSuper + 16 * g;
        float amax = 0.0f;
        for (std::size_t i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(sub[i]));
        for (std::size_t i = 0; i < 16; ++i) {
          const std::size_t k = b * kSuper + 16 * g + i;
          ASSERT_LE(std::fabs(y[k] - x[k]), amax / 4.0f + 4.0f * d)
              << "element " << k << " at spread " << spread;
          sum_x2 += double{x[k]} * x[k];
          err += double{y[k] - x[k]} * (y[k] - x[k]);
        }
      }
      EXPECT_LT(std::sqrt(err / sum_x2), 0.2) << "block " << b << " at spread " << spread;
    }
  }
}

TEST(BlockQ3_KTest, BadSizesAndNonFiniteValuesAreRefused) {
  std::vector<float> x(257, 1.0f);
  std::vector<BlockQ3_K> q(2);
  EXPECT_THAT([&] { quantize_q3_k(x, q); },
              ThrowsMessage<ShapeError>(HasSubstr(
                  "quantize q3_k: 257 values for 2 block(s) of 256: expected 512 values")));
  EXPECT_THAT([&] { dequantize_q3_k(q, std::span<float>(x).first(255)); },
              ThrowsMessage<ShapeError>(HasSubstr(
                  "dequantize q3_k: 255 values for 2 block(s) of 256: expected 512 values")));
  EXPECT_NO_THROW(quantize_q3_k({}, {}));
  // The blocks before the bad one are written; the bad one and those after are untouched.
  std::vector<float> y(3 * kSuper, 1.0f);
  y[300] = -std::numeric_limits<float>::infinity();
  std::vector<BlockQ3_K> out(3);
  for (BlockQ3_K& b : out) b.d = 0xABCD;
  EXPECT_THAT([&] { quantize_q3_k(y, out); },
              ThrowsMessage<ValueError>(HasSubstr("quantize q3_k: element 300 is -inf")));
  EXPECT_NE(out[0].d, 0xABCD);
  EXPECT_EQ(out[1].d, 0xABCD);
  EXPECT_EQ(out[2].d, 0xABCD);
}

// core/dtype.hpp's widened_element (the one-element decoder references and tests use, written
// apart from the runtime's codecs) gives exactly what each format's dequantizer gives, on random
// bytes whose f16 scales are finite: every code, sub-block scale and min pattern.
template <typename Block>
void expect_widened_elements_match(DType t,
                                   void (*dequantize)(std::span<const Block>, std::span<float>)) {
  constexpr std::size_t kBlocks = 64;
  std::vector<Block> blocks(kBlocks);
  std::mt19937 rng(41);
  std::uniform_int_distribution<int> byte(0, 255);
  auto* bytes = reinterpret_cast<unsigned char*>(blocks.data());
  for (std::size_t i = 0; i < kBlocks * sizeof(Block); ++i)
    bytes[i] = static_cast<unsigned char>(byte(rng));
  // Finite scales: f16 exponents below all ones (Q6_K keeps its d last, the others first).
  for (Block& b : blocks) {
    b.d = static_cast<std::uint16_t>(b.d & 0xBBFF);
    if constexpr (requires { b.dmin; }) b.dmin = static_cast<std::uint16_t>(b.dmin & 0xBBFF);
  }
  const std::int64_t per_block = traits(t).block_elements;
  std::vector<float> want(kBlocks * static_cast<std::size_t>(per_block));
  dequantize(blocks, want);
  for (std::size_t i = 0; i < want.size(); ++i) {
    const float got = widened_element(blocks.data(), t, static_cast<std::int64_t>(i));
    ASSERT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(want[i]))
        << to_string(t) << " element " << i << ": " << got << " vs " << want[i];
  }
}

TEST(BlockFormatsTest, WidenedElementsAreTheDequantizersValuesBitForBit) {
  expect_widened_elements_match<BlockQ8_0>(DType::kQ8_0, dequantize_q8_0);
  expect_widened_elements_match<BlockQ4_0>(DType::kQ4_0, dequantize_q4_0);
  expect_widened_elements_match<BlockQ5_0>(DType::kQ5_0, dequantize_q5_0);
  expect_widened_elements_match<BlockQ3_K>(DType::kQ3_K, dequantize_q3_k);
  expect_widened_elements_match<BlockQ4_K>(DType::kQ4_K, dequantize_q4_k);
  expect_widened_elements_match<BlockQ5_K>(DType::kQ5_K, dequantize_q5_k);
  expect_widened_elements_match<BlockQ6_K>(DType::kQ6_K, dequantize_q6_k);
}

// block_codec, the untyped entry the conversions and the prefill's dequantized tiles take, is
// each block format's own: its blocks decode by core's widened_element (written apart, per
// format) to what its dequantizer gives, near the values quantized; a NaN is refused by name.
TEST(BlockFormatsTest, EveryBlockFormatsCodecIsItsOwn) {
  constexpr std::int64_t kElements = 512;  // whole blocks of every format
  static_assert(whole_blocks_of_every_format(kElements));
  std::mt19937 rng(43);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(kElements);
  for (float& v : x) v = normal(rng);
  int formats = 0;
  for (const DTypeTraits& f : kDTypes) {
    if (is_element_dtype(f.dtype)) continue;
    SCOPED_TRACE(f.name);
    ++formats;
    const BlockCodec& codec = block_codec(f.dtype);
    std::vector<std::uint16_t> blocks(static_cast<std::size_t>(row_bytes(f.dtype, kElements)) / 2);
    codec.quantize(x, blocks.data());
    std::vector<float> back(kElements);
    codec.dequantize(blocks.data(), back);
    for (std::int64_t i = 0; i < kElements; ++i) {
      const auto at = static_cast<std::size_t>(i);
      ASSERT_EQ(std::bit_cast<std::uint32_t>(widened_element(blocks.data(), f.dtype, i)),
                std::bit_cast<std::uint32_t>(back[at]))
          << "element " << i;
      // Three bits a weight at the least: within about a quarter of the largest magnitude
      // (|x| < 6).
      EXPECT_NEAR(back[at], x[at], 1.75) << "element " << i;
    }
    std::vector<float> bad = x;
    bad[300] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_THAT([&] { codec.quantize(bad, blocks.data()); },
                ThrowsMessage<ValueError>(HasSubstr("300")));
  }
  EXPECT_EQ(formats, 9);
}

// ---- The searching quantizers at every kernel level (IQ4_NL, IQ4_XS, Q4_K, Q5_K, Q6_K) -------
// ----------------------------------------------

// Rows that take every branch of the scale search and of the indices' choice: Gaussian rows at
// scales from 1e-8 to 1e4,
// heavy tails, one outlier a run, runs below GGML's 1e-15 and runs just above it, constant runs,
// runs of exact codebook multiples (elements on the codebook's values and on the midpoints
// between neighbours, where the nearest value is a tie taken upward) and sparse runs.
std::vector<float> search_rows() {
  std::mt19937 rng(43);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::cauchy_distribution<float> cauchy(0.0f, 1.0f);
  std::uniform_int_distribution<int> index(0, 15);
  std::vector<float> x;
  const auto run = [&](auto&& element) {
    for (std::size_t j = 0; j < kBlock; ++j) x.push_back(element(j));
  };
  for (float scale : {1e-8f, 1e-3f, 1.0f, 37.5f, 1e4f}) {
    for (int r = 0; r < 64; ++r) run([&](std::size_t) { return scale * normal(rng); });
  }
  for (int r = 0; r < 64; ++r) {
    run([&](std::size_t) { return std::clamp(cauchy(rng), -1e6f, 1e6f); });
    const auto outlier = static_cast<std::size_t>(r) % kBlock;
    run([&](std::size_t j) { return j == outlier ? (r % 2 ? -50.0f : 50.0f) : normal(rng); });
    const float step = 0.01f * static_cast<float>(r + 1);
    run([&](std::size_t) { return step * static_cast<float>(kIQ4_NLValues[index(rng)]); });
    run([&](std::size_t) {  // the midpoint of two neighbouring values
      const int i = index(rng) % 15;
      return step * 0.5f * static_cast<float>(kIQ4_NLValues[i] + kIQ4_NLValues[i + 1]);
    });
    run([&](std::size_t j) { return j % 7 == 0 ? normal(rng) : 0.0f; });
  }
  for (float v : {0.0f, 1e-16f, -1e-16f, 2e-15f, -3.0f, 0.25f}) run([&](std::size_t) { return v; });
  run([&](std::size_t j) { return j == 3 ? 1e-15f : 0.0f; });
  // Whole super-blocks of 256 for IQ4_XS, then super-blocks whose eight sub-blocks span
  // 1e-20 .. 1e15 (the coded sub-block scales small against the largest, some rounding to 0).
  while (x.size() % 256 != 0) x.push_back(normal(rng));
  for (float base : {1e-20f, 1e-12f, 1e-4f}) {
    for (int g = 0; g < 8; ++g) {
      const float scale = base * std::pow(10.0f, static_cast<float>(g));
      run([&](std::size_t) { return scale * normal(rng); });
    }
  }
  return x;
}

class SearchLevelTest : public numesh::testing::KernelLevelTest {};

// The first block of `elements` that `quantize` writes differently at `level` than at the scalar
// level, or none.
template <typename Block, typename Quantize>
std::optional<std::size_t> first_block_apart(const std::vector<float>& x, std::size_t elements,
                                             Quantize quantize, KernelLevel level) {
  std::vector<Block> at(x.size() / elements);
  std::vector<Block> scalar(at.size());
  quantize(x, std::span<Block>(at), level);
  quantize(x, std::span<Block>(scalar), KernelLevel::kScalar);
  for (std::size_t b = 0; b < at.size(); ++b) {
    if (std::memcmp(&at[b], &scalar[b], sizeof(Block)) != 0) return b;
  }
  return std::nullopt;
}

// The levels' vector lanes run IQ4's 16 fits, and the K formats' sub-block searches, side
// by side; each lane must sum in GGML's order, so every level writes the scalar level's bytes.
TEST_P(SearchLevelTest, WritesTheScalarLevelsBytes) {
  const std::vector<float> x = search_rows();
  using Span = std::span<const float>;
  EXPECT_EQ(first_block_apart<BlockIQ4_NL>(
                x, kBlock, [](Span in, auto out, KernelLevel l) { quantize_iq4_nl(in, out, l); },
                level()),
            std::nullopt)
      << "iq4_nl";
  EXPECT_EQ(
      first_block_apart<BlockIQ4_XS>(
          x, 256, [](Span in, auto out, KernelLevel l) { quantize_iq4_xs(in, out, l); }, level()),
      std::nullopt)
      << "iq4_xs";
  EXPECT_EQ(
      first_block_apart<BlockQ4_K>(
          x, 256, [](Span in, auto out, KernelLevel l) { quantize_q4_k(in, out, l); }, level()),
      std::nullopt)
      << "q4_k";
  EXPECT_EQ(
      first_block_apart<BlockQ5_K>(
          x, 256, [](Span in, auto out, KernelLevel l) { quantize_q5_k(in, out, l); }, level()),
      std::nullopt)
      << "q5_k";
  EXPECT_EQ(
      first_block_apart<BlockQ6_K>(
          x, 256, [](Span in, auto out, KernelLevel l) { quantize_q6_k(in, out, l); }, level()),
      std::nullopt)
      << "q6_k";
  // And the default level (kernel_level()) is one of them.
  std::vector<BlockIQ4_NL> by_default(x.size() / kBlock), scalar(by_default.size());
  quantize_iq4_nl(x, by_default);
  quantize_iq4_nl(x, scalar, KernelLevel::kScalar);
  EXPECT_EQ(std::memcmp(by_default.data(), scalar.data(), scalar.size() * sizeof(BlockIQ4_NL)), 0);
}

NUMESH_INSTANTIATE_LEVELS(SearchLevelTest);

}  // namespace
}  // namespace numesh::runtime
