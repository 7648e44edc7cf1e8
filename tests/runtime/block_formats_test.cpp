// GGML's Q8_0 and Q4_0 block codecs on hand-checked blocks: scales and codes worked out from
// GGML's definitions, the rounding of exact halves, the sign of the Q4_0 scale, nibble packing,
// the blocks where GGML's reference is undefined or overflows, round-trip error bounds on random
// rows, and the errors. tests/runtime/block_formats_check.py compares bytes with a NumPy
// transcription of GGML (and GGML itself) on many more rows.

#include "numesh/runtime/block_formats.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

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
    quantize_q8_0(x, q8);
    quantize_q4_0(x, q4);
    std::vector<float> y8(x.size()), y4(x.size());
    dequantize_q8_0(q8, y8);
    dequantize_q4_0(q4, y4);
    for (std::size_t b = 0; b < q8.size(); ++b) {
      float amax = 0.0f, max = 0.0f;
      for (std::size_t j = 0; j < kBlock; ++j) {
        if (amax < std::fabs(x[b * kBlock + j])) {
          amax = std::fabs(x[b * kBlock + j]);
          max = x[b * kBlock + j];
        }
      }
      const float d8 = amax / 127.0f, d4 = std::fabs(max / -8.0f);
      const float d8_error = std::fabs(d8 - f32_from_f16(q8[b].d));
      const float d4_error = std::fabs(d4 - std::fabs(f32_from_f16(q4[b].d)));
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

}  // namespace
}  // namespace numesh::runtime
