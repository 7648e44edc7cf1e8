
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>

#include "../common/matches_reference.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/compare.hpp"
#include "numesh/ops/kernels/activations.hpp"
#include "numesh/ops/reference/attention.hpp"
#include "numesh/ops/reference/mlp.hpp"
#include "numesh/ops/reference/moe.hpp"
#include "numesh/ops/reference/norms.hpp"
#include "test_util.hpp"

namespace numesh::ops {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

RowMatrix pattern(Eigen::Index rows, Eigen::Index cols, float phase, float scale = 1.0f) {
  RowMatrix m(rows, cols);
  for (Eigen::Index i = 0; i < rows; ++i) {
    for (Eigen::Index j = 0; j < cols; ++j) {
      m(i, j) =
          scale * std::sin(phase + 0.37f * static_cast<float>(i) + 0.11f * static_cast<float>(j));
    }
  }
  return m;
}

Eigen::MatrixXd dmatmul(const Eigen::MatrixXd& a, const Eigen::MatrixXd& b) { return a * b; }

using testing::close;

TEST(ReferenceTest, GeluAndSiluMatchTheirClosedForms) {
  // Values from the definitions in double precision (PyTorch's F.gelu / F.silu agree).
  EXPECT_NEAR(gelu(1.0f), 0.8413447460685429, 1e-6);
  EXPECT_NEAR(gelu(-1.0f), -0.15865525393145707, 1e-6);
  EXPECT_EQ(gelu(0.0f), 0.0f);
  EXPECT_NEAR(silu(1.0f), 0.7310585786300049, 1e-6);
  EXPECT_NEAR(silu(-2.0f), -0.2384058440442351, 1e-6);
  // The stable sigmoid: no NaN or overflow at the extremes.
  EXPECT_LE(silu(-100.0f), 0.0f);
  EXPECT_GT(silu(-100.0f), -1e-40f);  // -100 * e^-100, a denormal
  EXPECT_FLOAT_EQ(silu(100.0f), 100.0f);
  EXPECT_FALSE(std::isnan(silu(-std::numeric_limits<float>::max())));
}

// The kernels of every activation against PyTorch 1.13's F.gelu, F.gelu(approximate="tanh")
// and F.silu and their autograd slopes in float64 (the float64 oracle's forms are held to
// PyTorch by torch_check and backward_check, through the MLP references).
TEST(ReferenceTest, ActivationKernelsAndTheOracleGivePyTorchsValuesAndSlopes) {
  const std::array<double, 5> x{1.0, -1.0, 3.0, -3.0, 0.25};
  struct Want {
    Activation act;
    std::array<double, 5> value, slope;
  };
  const Want wants[] = {
      {Activation::kGeluErf,
       {0.841344746068543, -0.15865525393145702, 2.99595030590511, -0.00404969409489031,
        0.14967658142073093},
       {1.0833154705876864, -0.08331547058768635, 1.011945647204184, -0.01194564720418392,
        0.695373354883636}},
      {Activation::kGeluTanh,
       {0.8411919906082768, -0.15880800939172324, 2.996362607918227, -0.0036373920817729943,
        0.149675350701685},
       {1.0829640838457826, -0.08296408384578252, 1.0115841666309695, -0.011584166630969648,
        0.6953540951510604}},
      {Activation::kSilu,
       {0.7310585786300049, -0.2689414213699951, 2.8577223804672998, -0.14227761953270035,
        0.14054412522144952},
       {0.9276705118714869, 0.07232948812851325, 1.0881041060151693, -0.08810410601516962,
        0.6237100215701977}},
  };
  for (const Want& w : wants) {
    RowMatrix values(1, 5), slopes = RowMatrix::Ones(1, 5);
    for (int i = 0; i < 5; ++i) values(0, i) = static_cast<float>(x[i]);
    const RowMatrix inputs = values;
    activation_inplace(w.act, MatrixMap(values.data(), 1, 5));
    activation_backward_inplace(w.act, ConstMatrixMap(inputs.data(), 1, 5),
                                MatrixMap(slopes.data(), 1, 5));
    for (int i = 0; i < 5; ++i) {
      SCOPED_TRACE(fmt::format("{} at {}", to_string(w.act), x[i]));
      EXPECT_NEAR(values(0, i), w.value[i], 2e-6);
      EXPECT_NEAR(slopes(0, i), w.slope[i], 2e-6);
    }
    // Far out the kernels saturate to the limits (x or 0, slope 1 or 0), never NaN.
    RowMatrix far(1, 2), far_slope = RowMatrix::Ones(1, 2);
    far << 1e4f, -1e4f;
    const RowMatrix far_in = far;
    activation_inplace(w.act, MatrixMap(far.data(), 1, 2));
    activation_backward_inplace(w.act, ConstMatrixMap(far_in.data(), 1, 2),
                                MatrixMap(far_slope.data(), 1, 2));
    EXPECT_FLOAT_EQ(far(0, 0), 1e4f) << to_string(w.act);
    EXPECT_FLOAT_EQ(far(0, 1), 0.0f) << to_string(w.act);
    EXPECT_FLOAT_EQ(far_slope(0, 0), 1.0f) << to_string(w.act);
    EXPECT_FLOAT_EQ(far_slope(0, 1), 0.0f) << to_string(w.act);
  }
}

TEST(ReferenceTest, MlpGeluMatchesADoublePrecisionComputation) {
  const RowMatrix x = pattern(6, 16, 0.1f), w1 = pattern(16, 40, 0.5f, 0.3f),
                  w2 = pattern(40, 16, 0.9f, 0.3f);
  const RowMatrix y = mlp_gelu_reference(x, w1, w2);
  Eigen::MatrixXd h = dmatmul(x.cast<double>(), w1.cast<double>());
  h = h.unaryExpr([](double v) { return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))); });
  const Eigen::MatrixXd want = dmatmul(h, w2.cast<double>());
  ASSERT_EQ(y.rows(), 6);
  ASSERT_EQ(y.cols(), 16);
  EXPECT_TRUE(close(y, want, 1e-5));
}

TEST(ReferenceTest, MlpSwigluMatchesADoublePrecisionComputation) {
  const RowMatrix x = pattern(5, 12, 0.2f), wg = pattern(12, 24, 0.4f, 0.4f),
                  wu = pattern(12, 24, 1.4f, 0.4f), wd = pattern(24, 12, 2.4f, 0.4f);
  const RowMatrix y = mlp_swiglu_reference(x, wg, wu, wd);
  Eigen::MatrixXd g = dmatmul(x.cast<double>(), wg.cast<double>());
  const Eigen::MatrixXd u = dmatmul(x.cast<double>(), wu.cast<double>());
  g = g.unaryExpr([](double v) { return v / (1.0 + std::exp(-v)); }).cwiseProduct(u);
  const Eigen::MatrixXd want = dmatmul(g, wd.cast<double>());
  EXPECT_TRUE(close(y, want, 1e-5));
}

TEST(ReferenceTest, RmsnormScalesEachRowToUnitRootMeanSquare) {
  const RowMatrix x = pattern(3, 8, 0.3f, 5.0f);
  RowMatrix ones = RowMatrix::Ones(1, 8);
  const RowMatrix y = rmsnorm_reference(x, ones, 0.0f);
  for (Eigen::Index t = 0; t < 3; ++t) {
    EXPECT_NEAR(std::sqrt(y.row(t).squaredNorm() / 8.0f), 1.0f, 1e-5f);
  }
  RowMatrix w = pattern(1, 8, 1.0f);
  const RowMatrix yw = rmsnorm_reference(x, w, 1e-6f);
  for (Eigen::Index t = 0; t < 3; ++t) {
    const double ms = x.row(t).cast<double>().squaredNorm() / 8.0;
    for (Eigen::Index h = 0; h < 8; ++h) {
      EXPECT_NEAR(yw(t, h), x(t, h) / std::sqrt(ms + 1e-6) * w(0, h), 1e-5);
    }
  }
}

runtime::HostTensor random_tensor(std::vector<std::int64_t> shape, unsigned seed) {
  runtime::HostTensor t = runtime::HostTensor::zeros(std::move(shape));
  for (std::size_t i = 0; i < t.data.size(); ++i) {
    t.data[i] = std::sin(0.7f * static_cast<float>(i) + static_cast<float>(seed));
  }
  return t;
}

AttentionConfig config(std::int64_t hq, std::int64_t hkv, std::int64_t d,
                       std::int64_t q_offset = 0) {
  AttentionConfig c;
  c.num_heads = hq;
  c.num_kv_heads = hkv;
  c.head_dim = d;
  c.q_offset = q_offset;
  return c;
}

TEST(AttentionReferenceTest, OneVisibleKeyReturnsItsValue) {
  // The first causal query sees only key 0, whatever the scores: its output is v[0].
  const auto q = random_tensor({1, 3, 2, 4}, 1), k = random_tensor({1, 3, 2, 4}, 2),
             v = random_tensor({1, 3, 2, 4}, 3);
  const auto out = attention_reference(q, k, v, config(2, 2, 4));
  for (std::size_t i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(out.data[i], v.data[i]);
}

TEST(AttentionReferenceTest, GqaEqualsMhaWithRepeatedKvHeads) {
  const auto q = random_tensor({2, 5, 4, 6}, 4), k = random_tensor({2, 5, 2, 6}, 5),
             v = random_tensor({2, 5, 2, 6}, 6);
  // Repeat each kv head twice: heads 0,1 use kv 0; heads 2,3 use kv 1.
  runtime::HostTensor k4 = runtime::HostTensor::zeros({2, 5, 4, 6}), v4 = k4;
  for (std::int64_t bt = 0; bt < 10; ++bt) {
    for (std::int64_t h = 0; h < 4; ++h) {
      for (std::int64_t i = 0; i < 6; ++i) {
        k4.data[static_cast<std::size_t>((bt * 4 + h) * 6 + i)] =
            k.data[static_cast<std::size_t>((bt * 2 + h / 2) * 6 + i)];
        v4.data[static_cast<std::size_t>((bt * 4 + h) * 6 + i)] =
            v.data[static_cast<std::size_t>((bt * 2 + h / 2) * 6 + i)];
      }
    }
  }
  EXPECT_EQ(attention_reference(q, k, v, config(4, 2, 6)),
            attention_reference(q, k4, v4, config(4, 4, 6)));
}

TEST(AttentionReferenceTest, DecodingTheLastTokenEqualsTheLastRowOfPrefill) {
  const std::int64_t t = 6;
  const auto q = random_tensor({1, t, 2, 8}, 7), k = random_tensor({1, t, 1, 8}, 8),
             v = random_tensor({1, t, 1, 8}, 9);
  const auto full = attention_reference(q, k, v, config(2, 1, 8));
  runtime::HostTensor last = runtime::HostTensor::zeros({1, 1, 2, 8});
  std::copy(q.data.end() - 16, q.data.end(), last.data.begin());
  const auto decoded = attention_reference(last, k, v, config(2, 1, 8, t - 1));
  for (std::size_t i = 0; i < 16; ++i) {
    EXPECT_NEAR(decoded.data[i], full.data[full.data.size() - 16 + i], 1e-6f);
  }
}

TEST(AttentionReferenceTest, BadShapesAreRejectedNamingThem) {
  const auto q = random_tensor({1, 4, 4, 8}, 1), k = random_tensor({1, 4, 2, 8}, 2);
  EXPECT_THAT([&] { attention_reference(q, k, k, config(4, 3, 8)); },
              ThrowsMessage<ShapeError>(HasSubstr("num_kv_heads 3 must divide num_heads 4")));
  EXPECT_THAT([&] { attention_reference(q, k, k, config(4, 4, 8)); },
              ThrowsMessage<ShapeError>(
                  HasSubstr("attention: q [1, 4, 4, 8], k [1, 4, 2, 8], v [1, 4, 2, 8] do not fit "
                            "num_heads 4, num_kv_heads 4, head_dim 8")));
  EXPECT_THAT(
      [&] { attention_reference(q, k, k, config(4, 2, 8, 3)); },
      ThrowsMessage<ShapeError>(HasSubstr("4 keys cannot cover causal queries at positions 3..6")));
  auto odd = random_tensor({1, 2, 1, 3}, 3);
  EXPECT_THAT([&] { apply_rope_reference(odd, 0, 10000.0f); },
              ThrowsMessage<ShapeError>(HasSubstr("rope: head_dim 3 is odd")));
}

MoeWeights moe_weights(std::int64_t h, std::int64_t f, std::int64_t e) {
  MoeWeights w;
  w.router = random_tensor({h, e}, 11);
  w.gate = random_tensor({e, h, f}, 12);
  w.up = random_tensor({e, h, f}, 13);
  w.down = random_tensor({e, f, h}, 14);
  for (auto* t : {&w.gate, &w.up, &w.down}) {
    for (float& v : t->data) v *= 0.3f;
  }
  return w;
}

TEST(MoeReferenceTest, AllExpertsWithRenormalisationIsTheProbabilityWeightedSum) {
  // k = E, dropless: every token goes to every expert with its softmax probability.
  const std::int64_t t = 5, h = 6, f = 10, e = 3;
  const RowMatrix x = pattern(t, h, 0.4f);
  const MoeWeights w = moe_weights(h, f, e);
  MoeStats stats;
  const RowMatrix y = moe_reference(
      x, w, {.num_experts = e, .top_k = e, .capacity_factor = 0.0f, .renormalize = true}, &stats);
  const RowMatrix router = Eigen::Map<const RowMatrix>(w.router.data.data(), h, e);
  RowMatrix want = RowMatrix::Zero(t, h);
  for (std::int64_t ti = 0; ti < t; ++ti) {
    Eigen::RowVectorXf logits = x.row(ti) * router;
    Eigen::RowVectorXf p = (logits.array() - logits.maxCoeff()).exp().matrix();
    p /= p.sum();
    for (std::int64_t ex = 0; ex < e; ++ex) {
      const auto off = static_cast<std::size_t>(ex * h * f);
      const RowMatrix out = mlp_swiglu_reference(
          x.row(ti), Eigen::Map<const RowMatrix>(w.gate.data.data() + off, h, f),
          Eigen::Map<const RowMatrix>(w.up.data.data() + off, h, f),
          Eigen::Map<const RowMatrix>(w.down.data.data() + off, f, h));
      want.row(ti) += p(ex) * out.row(0);
    }
  }
  EXPECT_TRUE(close(y, want.cast<double>(), 1e-5));
  EXPECT_EQ(stats.tokens_per_expert, (std::vector<std::int64_t>{5, 5, 5}));
  EXPECT_EQ(stats.dropped, 0);
  EXPECT_EQ(stats.capacity, 0);
}

TEST(MoeReferenceTest, CapacityDropsAssignmentsAndCountsThem) {
  const std::int64_t t = 16, h = 6, f = 8, e = 4;
  const RowMatrix x = pattern(t, h, 1.1f, 2.0f);
  const MoeWeights w = moe_weights(h, f, e);
  MoeStats dropless, capped;
  const RowMatrix y0 = moe_reference(
      x, w, {.num_experts = e, .top_k = 2, .capacity_factor = 0.0f, .renormalize = true},
      &dropless);
  const RowMatrix y1 = moe_reference(
      x, w, {.num_experts = e, .top_k = 2, .capacity_factor = 0.5f, .renormalize = true}, &capped);
  std::int64_t kept0 = 0, kept1 = 0;
  for (auto n : dropless.tokens_per_expert) kept0 += n;
  for (auto n : capped.tokens_per_expert) {
    kept1 += n;
    EXPECT_LE(n, 4) << "capacity ceil(0.5 * 16 * 2 / 4) = 4";
  }
  EXPECT_EQ(kept0, 32);
  EXPECT_EQ(dropless.dropped, 0);
  EXPECT_EQ(capped.capacity, 4);
  EXPECT_EQ(kept1 + capped.dropped, 32);
  EXPECT_GT(capped.dropped, 0) << "16 tokens x 2 choices cannot fit 4 experts x 4 slots";
  const Comparison dropped_vs_not =
      compare(std::span<const float>(y1.data(), static_cast<std::size_t>(y1.size())),
              std::span<const float>(y0.data(), static_cast<std::size_t>(y0.size())));
  EXPECT_TRUE(dropped_vs_not.is_finite_reference() && dropped_vs_not.nonfinite_mismatches == 0);
  EXPECT_GT(dropped_vs_not.max_abs_error, 0.0) << "dropping changes some outputs";
}

TEST(MoeReferenceTest, BadConfigsAreRejectedNamingThem) {
  const RowMatrix x = pattern(4, 6, 0.0f);
  const MoeWeights w = moe_weights(6, 8, 2);
  EXPECT_THAT(
      [&] {
        moe_reference(x, w,
                      {.num_experts = 2, .top_k = 3, .capacity_factor = 0.0f, .renormalize = true});
      },
      ThrowsMessage<ValueError>(HasSubstr("moe: top_k 3 must be between 1 and the 2 experts")));
  EXPECT_THAT(
      [&] {
        moe_reference(
            x, w, {.num_experts = 2, .top_k = 1, .capacity_factor = -1.0f, .renormalize = true});
      },
      ThrowsMessage<ValueError>(HasSubstr("capacity_factor -1 is negative")));
  EXPECT_THAT(
      [&] {
        moe_reference(x, w,
                      {.num_experts = 2,
                       .top_k = 1,
                       .capacity_factor = std::numeric_limits<float>::quiet_NaN(),
                       .renormalize = true});
      },
      ThrowsMessage<ValueError>("moe: capacity_factor nan is not finite"));
  EXPECT_THAT(
      [&] {
        moe_reference(x, w,
                      {.num_experts = 3, .top_k = 1, .capacity_factor = 0.0f, .renormalize = true});
      },
      ThrowsMessage<ShapeError>(
          HasSubstr("moe: router is [6, 2], expected [6, 3] for x [4, 6] and 3 experts")));
  MoeWeights bad = w;
  bad.down = random_tensor({2, 7, 6}, 1);
  EXPECT_THAT(
      [&] {
        moe_reference(x, bad,
                      {.num_experts = 2, .top_k = 1, .capacity_factor = 0.0f, .renormalize = true});
      },
      ThrowsMessage<ShapeError>(HasSubstr("do not fit 2 experts and hidden 6")));
}

// The biases the MLP oracle adds (Llama's mlp_bias), against the computation written out in
// double: silu(x wg + bg) .* (x wu + bu) wd + bd, and gelu(x w1 + b1) w2 + b2.
TEST(ReferenceTest, MlpBiasesAreAddedToEachProjection) {
  const RowMatrix x = pattern(5, 8, 0.2f), wg = pattern(8, 12, 0.4f, 0.3f),
                  wu = pattern(8, 12, 0.7f, 0.3f), wd = pattern(12, 8, 1.1f, 0.3f);
  const RowMatrix bg = pattern(1, 12, 1.3f, 0.5f), bu = pattern(1, 12, 1.7f, 0.5f),
                  bd = pattern(1, 8, 2.3f, 0.5f);
  const auto host = [](const RowMatrix& m, std::vector<std::int64_t> shape) {
    return runtime::HostTensor{.shape = std::move(shape),
                               .data = std::vector<float>(m.data(), m.data() + m.size())};
  };
  MlpWeights w{.gate = host(wg, {8, 12}), .up = host(wu, {8, 12}), .down = host(wd, {12, 8})};
  w.gate_bias = host(bg, {12});
  w.up_bias = host(bu, {12});
  w.down_bias = host(bd, {8});
  const Eigen::MatrixXd xd = x.cast<double>();
  const Eigen::RowVectorXd bgd = bg.cast<double>().row(0), bud = bu.cast<double>().row(0),
                           bdd = bd.cast<double>().row(0);
  Eigen::MatrixXd gate = (xd * wg.cast<double>()).rowwise() + bgd;
  gate = gate.unaryExpr([](double v) { return v / (1.0 + std::exp(-v)); });
  const Eigen::MatrixXd up = (xd * wu.cast<double>()).rowwise() + bud;
  const Eigen::MatrixXd swiglu = (gate.cwiseProduct(up) * wd.cast<double>()).rowwise() + bdd;
  EXPECT_TRUE(close(mlp_reference(x, MlpKind::kSwiGLU, w), swiglu, 1e-5));
  MlpWeights g = w;
  g.gate = {};
  g.gate_bias = {};
  const Eigen::MatrixXd h =
      up.unaryExpr([](double v) { return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))); });
  EXPECT_TRUE(
      close(mlp_reference(x, MlpKind::kGelu, g), (h * wd.cast<double>()).rowwise() + bdd, 1e-5));
  // Without biases it is mlp_swiglu_reference.
  MlpWeights plain = w;
  plain.gate_bias = plain.up_bias = plain.down_bias = {};
  EXPECT_TRUE(close(mlp_reference(x, MlpKind::kSwiGLU, plain),
                    mlp_swiglu_reference(x, wg, wu, wd).cast<double>(), 1e-6));
}

// Qwen2-MoE's shared expert: the layer's output is the routed experts' plus
// sigmoid(x g) * swiglu_shared(x), token by token.
TEST(MoeReferenceTest, TheSharedExpertAddsItsGatedOutput) {
  const std::int64_t t = 6, h = 6, f = 8, e = 4, fs = 10;
  const RowMatrix x = pattern(t, h, 0.3f);
  MoeWeights w = moe_weights(h, f, e);
  const MoeConfig c{.num_experts = e, .top_k = 2, .capacity_factor = 0.0f, .renormalize = false};
  const RowMatrix routed = moe_reference(x, w, c);
  w.shared_expert.gate = random_tensor({h, fs}, 15);
  w.shared_expert.up = random_tensor({h, fs}, 16);
  w.shared_expert.down = random_tensor({fs, h}, 17);
  w.shared_expert_gate = random_tensor({h, 1}, 18);
  const auto mat = [](const runtime::HostTensor& m) {
    return Eigen::Map<const RowMatrix>(m.data.data(), m.shape[0], m.shape[1]);
  };
  const RowMatrix shared = mlp_swiglu_reference(x, mat(w.shared_expert.gate),
                                                mat(w.shared_expert.up), mat(w.shared_expert.down));
  const Eigen::VectorXd logit = x.cast<double>() * mat(w.shared_expert_gate).cast<double>();
  Eigen::MatrixXd want = routed.cast<double>();
  for (std::int64_t ti = 0; ti < t; ++ti) {
    want.row(ti) += shared.row(ti).cast<double>() / (1.0 + std::exp(-logit(ti)));
  }
  EXPECT_TRUE(close(moe_reference(x, w, c), want, 1e-5));
}

TEST(ReferenceTest, BadShapesAreRejectedNamingThem) {
  const RowMatrix x(4, 8), w1(8, 16), bad(9, 8), wd(16, 8);
  EXPECT_THAT(
      [&] { mlp_gelu_reference(x, w1, bad); },
      ThrowsMessage<ShapeError>(HasSubstr(
          "mlp_gelu: x [4, 8], up-projection [8, 16] and down-projection [9, 8] do not chain")));
  EXPECT_THAT([&] { mlp_swiglu_reference(x, w1, RowMatrix(8, 15), wd); },
              ThrowsMessage<ShapeError>(HasSubstr(
                  "mlp_swiglu: gate [8, 16] and up [8, 15] projections differ in shape")));
  EXPECT_THAT([&] { rmsnorm_reference(x, RowMatrix(1, 7)); },
              ThrowsMessage<ShapeError>(
                  HasSubstr("rmsnorm: weight is [1, 7], expected [1, 8] for x [4, 8]")));
  EXPECT_THAT([&] { rmsnorm_reference(x, RowMatrix::Ones(1, 8), -1.0f); },
              ThrowsMessage<ValueError>(HasSubstr("rmsnorm: eps -1 is negative")));
}

TEST(MoeConfigTest, ExpertCapacityIsGShardsAndAHugeFactorLimitsNothing) {
  const MoeConfig c{.num_experts = 4, .top_k = 2, .capacity_factor = 1.25f, .renormalize = true};
  EXPECT_EQ(expert_capacity(c, 10), 7);  // ceil(1.25 * 10 * 2 / 4)
  EXPECT_EQ(expert_capacity({.num_experts = 4, .top_k = 2, .capacity_factor = 0.0f}, 10), 0);
  // 1e30 * 10 * 2 / 4 does not fit an int64: the bound, which no group reaches.
  EXPECT_EQ(expert_capacity({.num_experts = 4, .top_k = 2, .capacity_factor = 1e30f}, 10),
            std::int64_t{1} << 62);
  EXPECT_THAT(
      [] {
        check_moe_config({.num_experts = 4,
                          .top_k = 2,
                          .capacity_factor = std::numeric_limits<float>::infinity()});
      },
      ThrowsMessage<ValueError>("moe: capacity_factor inf is not finite"));
}

}  // namespace
}  // namespace numesh::ops
