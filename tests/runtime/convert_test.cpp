#include "numesh/runtime/convert.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "../common/kernel_levels.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/runtime/cpu_features.hpp"

namespace numesh::runtime {
namespace {

float from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }

// Values that exercise every rounding case: ties to even in both directions, carries into the
// exponent, overflow to infinity, f16 and bf16 subnormals, signed zeros, NaN, plus random
// values over every exponent. Length 1000 + 7: not a multiple of any vector width.
std::vector<float> edge_and_random_values() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          65504.0f,
                          65519.0f,
                          65520.0f,
                          65536.0f,
                          -65520.0f,
                          6.0e-8f,
                          5.9604645e-8f,
                          2.9802322e-8f,
                          2.9e-8f,
                          3.0e-8f,
                          6.1035156e-5f,
                          6.1e-5f,
                          1.0e-40f,
                          -1.0e-40f,
                          3.4e38f,
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          -std::numeric_limits<float>::quiet_NaN(),
                          from_bits(0x7F800001u),
                          from_bits(0xFFA00000u),
                          from_bits(0x3F808000u),
                          from_bits(0x3F818000u),
                          from_bits(0x3F808001u),  // bf16 ties
                          from_bits(0x3F801000u),
                          from_bits(0x3F803000u),
                          from_bits(0x3F801001u)};  // f16 ties
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> any;
  while (v.size() < 1007) v.push_back(from_bits(any(rng)));
  return v;
}

TEST(DtypeTest, ScalarConversionsGiveThePyTorchAndNumPyBits) {
  // Bits PyTorch 1.13 (x.to(torch.bfloat16 / torch.float16)) and NumPy (astype(np.float16))
  // give for these fp32 values.
  EXPECT_EQ(bf16_from_f32(1.0e-40f), 0x0001);  // a subnormal, not flushed
  EXPECT_EQ(bf16_from_f32(3.4e38f), 0x7F80);   // rounds up to infinity
  EXPECT_EQ(bf16_from_f32(65520.0f), 0x4780);
  EXPECT_EQ(f16_from_f32(65520.0f), 0x7C00);
  EXPECT_EQ(f16_from_f32(65519.0f), 0x7BFF);
  EXPECT_EQ(f16_from_f32(6.0e-8f), 0x0001);
  EXPECT_EQ(f16_from_f32(2.9e-8f), 0x0000);
  EXPECT_EQ(f16_from_f32(1.0e-40f), 0x0000);
  EXPECT_EQ(f16_from_f32(-0.0f), 0x8000);
  EXPECT_EQ(f16_from_f32(2.9802322e-8f), 0x0000) << "2^-25: the tie rounds to the even zero";
  EXPECT_EQ(f16_from_f32(from_bits(0x3F801000u)), 0x3C00) << "tie to even, down";
  EXPECT_EQ(f16_from_f32(from_bits(0x3F803000u)), 0x3C02) << "tie to even, up";
  EXPECT_EQ(bf16_from_f32(from_bits(0x3F808000u)), 0x3F80) << "tie to even, down";
  EXPECT_EQ(bf16_from_f32(from_bits(0x3F818000u)), 0x3F82) << "tie to even, up";
  // NaN: canonical quiet NaN with the sign.
  EXPECT_EQ(bf16_from_f32(std::numeric_limits<float>::quiet_NaN()), 0x7FC0);
  EXPECT_EQ(bf16_from_f32(-std::numeric_limits<float>::quiet_NaN()), 0xFFC0);
  EXPECT_EQ(f16_from_f32(from_bits(0x7F800001u)), 0x7E00);
  EXPECT_EQ(f16_from_f32(-std::numeric_limits<float>::quiet_NaN()), 0xFE00);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::kBF16);
  EXPECT_THROW((void)parse_dtype("int4"), ValueError);
}

// The format table: every DType once, in order, named and parsed by its names, sized by its
// blocks (element types: blocks of one), and a row that is not whole blocks refused by name.
TEST(DtypeTest, TheFormatTableNamesSizesAndParsesEveryFormat) {
  for (std::size_t i = 0; i < kDTypes.size(); ++i) {
    const DTypeTraits& f = kDTypes[i];
    EXPECT_EQ(static_cast<std::size_t>(f.dtype), i);
    EXPECT_EQ(&traits(f.dtype), &f);
    EXPECT_EQ(to_string(f.dtype), f.name);
    EXPECT_EQ(parse_dtype(f.name), f.dtype);
    for (std::string_view alias : f.aliases) {
      if (!alias.empty()) {
        EXPECT_EQ(parse_dtype(alias), f.dtype) << alias;
      }
    }
    EXPECT_EQ(is_element_dtype(f.dtype), f.block_elements == 1) << f.name;
    EXPECT_EQ(static_cast<std::int64_t>(dtype_size(f.dtype)),
              f.block_elements == 1 ? f.block_bytes : 0)
        << f.name;
    EXPECT_EQ(row_bytes(f.dtype, 768), 768 * f.block_bytes / f.block_elements) << f.name;
  }
  EXPECT_EQ(dtype_size(DType::kF32), 4U);
  EXPECT_EQ(dtype_size(DType::kBF16), 2U);
  EXPECT_EQ(dtype_size(DType::kF16), 2U);
  EXPECT_EQ(row_bytes(DType::kQ8_0, 64), 68) << "GGML's block_q8_0: 34 bytes a 32";
  EXPECT_EQ(row_bytes(DType::kQ4_0, 64), 36) << "GGML's block_q4_0: 18 bytes a 32";
  EXPECT_EQ(row_bytes(DType::kQ5_0, 64), 44) << "GGML's block_q5_0: 22 bytes a 32";
  EXPECT_EQ(row_bytes(DType::kQ4_K, 512), 288) << "GGML's block_q4_K: 144 bytes a 256";
  EXPECT_EQ(row_bytes(DType::kQ5_K, 512), 352) << "GGML's block_q5_K: 176 bytes a 256";
  EXPECT_EQ(row_bytes(DType::kQ6_K, 512), 420) << "GGML's block_q6_K: 210 bytes a 256";
  // Help texts list the formats from the table.
  EXPECT_EQ(dtype_choices(),
            "f32, bf16, f16, q8_0, q4_0, q5_0, iq4_nl, q3_k, q4_k, q5_k, q6_k or iq4_xs");
  EXPECT_EQ(dtype_choices(is_element_dtype), "f32, bf16 or f16");
  EXPECT_TRUE(whole_blocks_of_every_format(0));
  EXPECT_TRUE(whole_blocks_of_every_format(2048));
  EXPECT_FALSE(whole_blocks_of_every_format(96)) << "three q8_0 blocks, not whole q4_k ones";
  EXPECT_THAT(
      [] { (void)parse_dtype("q4"); },
      ::testing::ThrowsMessage<ValueError>("dtype 'q4': expected f32, bf16, f16, q8_0, "
                                           "q4_0, q5_0, iq4_nl, q3_k, q4_k, q5_k, q6_k or iq4_xs"));
  EXPECT_THAT([] { (void)row_bytes(DType::kF32, -1); },
              ::testing::ThrowsMessage<ValueError>(
                  "f32: a row of -1 elements is not a whole number of 1-element blocks"));
  EXPECT_THAT([] { (void)row_bytes(DType::kQ8_0, 48); },
              ::testing::ThrowsMessage<ValueError>(
                  "q8_0: a row of 48 elements is not a whole number of 32-element blocks"));
}

TEST(DtypeTest, EverySixteenBitPatternRoundTripsExactly) {
  // All 65536 patterns: widening is exact and narrowing the result gives the pattern back
  // (NaN patterns come back as NaN).
  for (std::uint32_t h = 0; h <= 0xFFFF; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float f = f32_from_f16(bits), b = f32_from_bf16(bits);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f32_from_f16(f16_from_f32(f)))) << std::hex << h;
    } else {
      ASSERT_EQ(f16_from_f32(f), bits) << std::hex << h;
    }
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(f32_from_bf16(bf16_from_f32(b)))) << std::hex << h;
    } else {
      ASSERT_EQ(bf16_from_f32(b), bits) << std::hex << h;
    }
  }
  EXPECT_EQ(f32_from_f16(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_from_f16(0x7BFF), 65504.0f);
}

// Each kernel level gives the scalar bits (a level this CPU cannot run is a skip naming it).
class ConvertLevelTest : public numesh::testing::KernelLevelTest {};

TEST_P(ConvertLevelTest, EqualsTheScalarConversion) {
  const std::vector<float> x = edge_and_random_values();
  const std::size_t n = x.size();
  std::vector<std::uint16_t> bf_want(n), f16_want(n);
  std::vector<float> bf_back_want(n), f16_back_want(n);
  convert_f32_to_bf16(x, bf_want, KernelLevel::kScalar);
  convert_f32_to_f16(x, f16_want, KernelLevel::kScalar);
  convert_bf16_to_f32(bf_want, bf_back_want, KernelLevel::kScalar);
  convert_f16_to_f32(f16_want, f16_back_want, KernelLevel::kScalar);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(bf_want[i], bf16_from_f32(x[i]));
    ASSERT_EQ(f16_want[i], f16_from_f32(x[i]));
  }
  const KernelLevel l = level();
  std::vector<std::uint16_t> bf(n), f16(n);
  std::vector<float> bf_back(n), f16_back(n);
  convert_f32_to_bf16(x, bf, l);
  convert_f32_to_f16(x, f16, l);
  convert_bf16_to_f32(bf_want, bf_back, l);
  convert_f16_to_f32(f16_want, f16_back, l);
  EXPECT_EQ(bf, bf_want);
  EXPECT_EQ(f16, f16_want);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(bf_back[i]),
              std::bit_cast<std::uint32_t>(bf_back_want[i]))
        << "bf16 -> f32 at " << i;
    ASSERT_EQ(std::bit_cast<std::uint32_t>(f16_back[i]),
              std::bit_cast<std::uint32_t>(f16_back_want[i]))
        << "f16 -> f32 at " << i;
  }
}

NUMESH_INSTANTIATE_LEVELS(ConvertLevelTest);

TEST(CpuFeaturesTest, TheWidestLevelFollowsTheFeatures) {
  runtime::CpuFeatures f;
  EXPECT_EQ(runtime::widest_kernel_level(f), KernelLevel::kScalar);
  f.avx2 = f.fma = f.f16c = true;
  EXPECT_EQ(runtime::widest_kernel_level(f), KernelLevel::kAvx2);
  f.avx512f = f.avx512bw = f.avx512vl = true;
  EXPECT_EQ(runtime::widest_kernel_level(f), KernelLevel::kAvx512);
  f.avx512_bf16 = true;
  EXPECT_EQ(runtime::widest_kernel_level(f), KernelLevel::kAvx512) << "BF16 without VNNI";
  f.avx512_vnni = true;
  EXPECT_EQ(runtime::widest_kernel_level(f), KernelLevel::kAvx512Bf16);
  f.amx = true;
  EXPECT_EQ(runtime::widest_kernel_level(f), KernelLevel::kAmx);
  f.avx512_bf16 = false;
  EXPECT_EQ(runtime::widest_kernel_level(f), KernelLevel::kAvx512) << "AMX without AVX-512 BF16";
  f.avx512_bf16 = true;
  f.f16c = false;
  EXPECT_EQ(runtime::widest_kernel_level(f), KernelLevel::kScalar)
      << "every level needs the AVX2 set";
  EXPECT_EQ(runnable_kernel_levels().front(), KernelLevel::kScalar);
  EXPECT_EQ(runnable_kernel_levels().back(), runtime::widest_kernel_level(runtime::cpu_features()));
}

}  // namespace
}  // namespace numesh::runtime
