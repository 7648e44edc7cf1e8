// RoPE frequency scaling (RopeScaling: linear and Llama 3.1's llama3): the kernel against the
// float64 reference for every kind, properties that pin the formulas down, and the validation.
// The formulas themselves are checked against Hugging Face's, written in PyTorch, by the
// PyTorch check (torch_check.py: the attn_*_scaling and layer_*_llama3 cases).

#include "numesh/ops/kernels/rope.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <optional>
#include <tuple>
#include <vector>

#include "numesh/core/error.hpp"
#include "numesh/ops/reference/attention.hpp"
#include "numesh/ops/rope_scaling.hpp"
#include "test_util.hpp"

namespace numesh::ops {
namespace {

using ::testing::ThrowsMessage;

RopeScaling linear(double factor) { return RopeScaling::linear(factor); }

// Llama 3.1's published values.
RopeScaling llama3(double factor = 8.0) { return RopeScaling::llama3(factor, 1.0, 4.0, 8192); }

// The largest |a - b| over the elements; infinity where one is NaN (std::max would skip it).
double max_abs_difference(const runtime::HostTensor& a, const runtime::HostTensor& b) {
  double worst = 0.0;
  for (std::size_t i = 0; i < a.data.size(); ++i) {
    const double d = std::abs(static_cast<double>(a.data[i]) - static_cast<double>(b.data[i]));
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, d);
  }
  return worst;
}

TEST(RopeTest, KernelMatchesTheReferenceForEveryScaling) {
  const runtime::HostTensor x = testing::random_host({2, 5, 3, 128}, 7, 1.0f);
  for (const RopeScaling& s : {RopeScaling{}, linear(4.0), llama3()}) {
    for (std::int64_t first : {std::int64_t{0}, std::int64_t{9000}}) {
      runtime::HostTensor want = x, got = x;
      apply_rope_reference(want, first, 500000.0f, s);
      rope_inplace(got.data.data(), 2, 5, 3, 128, first, 500000.0f, s);
      // fp32 rotations of unit-variance values by angles computed in double: a few ulps.
      EXPECT_LT(max_abs_difference(got, want), 2e-6) << to_string(s.kind) << " at " << first;
    }
  }
}

TEST(RopeTest, ScalingChangesTheFrequenciesItShould) {
  const std::int64_t d = 128;
  const double theta = 500000.0;
  const std::vector<double> plain = rope_frequencies(d, theta);
  const std::vector<double> lin = rope_frequencies(d, theta, linear(4.0));
  const std::vector<double> l3 = rope_frequencies(d, theta, llama3());
  const std::vector<double> l3_one = rope_frequencies(d, theta, llama3(1.0));
  ASSERT_EQ(plain.size(), 64u);
  int kept = 0, divided = 0, blended = 0;
  for (std::size_t i = 0; i < plain.size(); ++i) {
    EXPECT_DOUBLE_EQ(plain[i], std::pow(theta, -2.0 * static_cast<double>(i) / 128.0)) << i;
    EXPECT_DOUBLE_EQ(lin[i], plain[i] / 4.0) << i;
    EXPECT_NEAR(l3_one[i], plain[i], 1e-15 * plain[i]) << "factor 1 changes nothing, pair " << i;
    const double wavelength = 2.0 * std::numbers::pi / plain[i];
    if (wavelength < 8192.0 / 4.0) {
      EXPECT_EQ(l3[i], plain[i]) << "short waves are kept, pair " << i;
      ++kept;
    } else if (wavelength > 8192.0) {
      EXPECT_DOUBLE_EQ(l3[i], plain[i] / 8.0) << "long waves are divided, pair " << i;
      ++divided;
    } else {
      EXPECT_GT(l3[i], plain[i] / 8.0) << i;
      EXPECT_LT(l3[i], plain[i]) << i;
      ++blended;
    }
  }
  // theta 500000, d 128: every band is populated.
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
}

TEST(RopeTest, LinearScalingIsPositionInterpolation) {
  // Position p with every frequency divided by 4 turns as position p / 4 does unscaled.
  const runtime::HostTensor x = testing::random_host({1, 1, 2, 64}, 3, 1.0f);
  runtime::HostTensor scaled = x, plain = x;
  rope_inplace(scaled.data.data(), 1, 1, 2, 64, 4000, 10000.0f, linear(4.0));
  rope_inplace(plain.data.data(), 1, 1, 2, 64, 1000, 10000.0f);
  EXPECT_LT(max_abs_difference(scaled, plain), 1e-6);
}

// The divisors GGUF's rope_freqs holds (f32) for a llama3 scaling read back as that scaling:
// Llama 3.1's own, and one whose band factors are scaled (the same divisors, read with low 1).
// Divisors no llama3 scaling gives, or a band of fewer than two pairs, give none.
TEST(RopeTest, Llama3ScalingIsReadBackFromItsDivisors) {
  const auto divisors = [](std::int64_t d, double theta, const RopeScaling& s) {
    const std::vector<double> base = rope_frequencies(d, theta),
                              scaled = rope_frequencies(d, theta, s);
    std::vector<double> out;
    for (std::size_t i = 0; i < base.size(); ++i)
      out.push_back(static_cast<double>(static_cast<float>(base[i] / scaled[i])));  // as stored
    return out;
  };
  // Read back as (factor, high_freq_factor, original_max_position), low_freq_factor 1.
  const auto read_back = [&](std::int64_t d, const RopeScaling& s) {
    const std::optional<RopeScaling> r = llama3_of_divisors(divisors(d, 500000.0, s), d, 500000.0);
    EXPECT_TRUE(r.has_value() && r->kind == RopeScaling::Kind::kLlama3 &&
                r->low_freq_factor == 1.0);
    return r ? std::make_tuple(r->factor, r->high_freq_factor, r->original_max_position)
             : std::make_tuple(0.0, 0.0, std::int64_t{0});
  };
  EXPECT_EQ(read_back(128, RopeScaling::llama3(8.0, 1.0, 4.0, 8192)),
            std::make_tuple(8.0, 4.0, std::int64_t{8192}));
  // low 2, high 8 over 16384 is the same band as 1, 4 over 8192.
  EXPECT_EQ(read_back(128, RopeScaling::llama3(32.0, 2.0, 8.0, 16384)),
            std::make_tuple(32.0, 4.0, std::int64_t{8192}));
  // A small model's (head_dim 64, the random models' band over 1024 positions).
  EXPECT_EQ(read_back(64, RopeScaling::llama3(8.0, 1.0, 4.0, 1024)),
            std::make_tuple(8.0, 4.0, std::int64_t{1024}));
  // Not a llama3 scaling's: linear, a bump in the band, all ones, the wrong count.
  EXPECT_FALSE(llama3_of_divisors(std::vector<double>(64, 2.0), 128, 500000.0).has_value());
  std::vector<double> bumped = divisors(128, 500000.0, RopeScaling::llama3(8.0, 1.0, 4.0, 8192));
  for (double& v : bumped) {
    if (v > 1.5 && v < 7.5) {
      v *= 1.01;
      break;
    }
  }
  EXPECT_FALSE(llama3_of_divisors(bumped, 128, 500000.0).has_value());
  EXPECT_FALSE(llama3_of_divisors(std::vector<double>(64, 1.0), 128, 500000.0).has_value());
  EXPECT_FALSE(llama3_of_divisors(std::vector<double>(3, 2.0), 128, 500000.0).has_value());
  // head_dim 16 and theta 500000 (wavelengths 6.3, 33, 168, ...): a band of (16, 64) holds one
  // pair, read with Llama 3.1's ratio of 4. At theta 10000 (6.3, 20, 63, 199, ...) a band of
  // (32, 64) holds one pair of another ratio, which no scaling of ratio 4 gives, and one of
  // (100, 150) holds none, leaving nothing to read.
  const std::optional<RopeScaling> one = llama3_of_divisors(
      divisors(16, 500000.0, RopeScaling::llama3(8.0, 1.0, 4.0, 64)), 16, 500000.0);
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->high_freq_factor, 4.0);
  EXPECT_EQ(one->original_max_position, 64);
  EXPECT_FALSE(
      llama3_of_divisors(divisors(16, 10000.0, RopeScaling::llama3(8.0, 1.0, 2.0, 64)), 16, 10000.0)
          .has_value());
  EXPECT_FALSE(llama3_of_divisors(divisors(16, 10000.0, RopeScaling::llama3(8.0, 1.0, 1.5, 150)),
                                  16, 10000.0)
                   .has_value());
}

TEST(RopeTest, InvalidScalingIsRejectedNamingTheField) {
  EXPECT_THAT([] { validate(linear(0.0)); },
              ThrowsMessage<ValueError>("rope scaling linear: factor 0 must be positive"));
  EXPECT_THAT([] { validate(linear(std::nan(""))); },
              ThrowsMessage<ValueError>("rope scaling linear: factor nan must be positive"));
  RopeScaling bands = llama3();
  bands.low_freq_factor = 4.0;
  EXPECT_THAT([&] { validate(bands); },
              ThrowsMessage<ValueError>(
                  "rope scaling llama3: low_freq_factor 4 and high_freq_factor 4 must satisfy "
                  "0 < low < high"));
  RopeScaling context = llama3();
  context.original_max_position = 0;
  EXPECT_THAT(
      [&] { validate(context); },
      ThrowsMessage<ValueError>("rope scaling llama3: original_max_position 0 must be positive"));
  RopeScaling none;
  none.factor = -1.0;
  validate(none);  // none reads no field
  // Every user of the config refuses it before computing anything.
  runtime::HostTensor x = testing::random_host({1, 1, 1, 8}, 1, 1.0f);
  EXPECT_THAT([&] { apply_rope_reference(x, 0, 10000.0f, linear(-2.0)); },
              ThrowsMessage<ValueError>("rope scaling linear: factor -2 must be positive"));
  AttentionConfig config{.num_heads = 1, .num_kv_heads = 1, .head_dim = 8};
  config.rope_scaling = bands;
  EXPECT_THAT(
      [&] { attention_reference(x, x, x, config); },
      ThrowsMessage<ValueError>(::testing::HasSubstr("low_freq_factor 4 and high_freq_factor 4")));
  EXPECT_EQ(to_string(RopeScaling::Kind::kLlama3), "llama3");
  EXPECT_EQ(to_string(RopeScaling::Kind::kLinear), "linear");
  EXPECT_EQ(to_string(RopeScaling::Kind::kNone), "none");
}

}  // namespace
}  // namespace numesh::ops
