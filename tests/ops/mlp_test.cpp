#include "numesh/ops/lowering/mlp.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <span>
#include <utility>

#include "numesh/core/error.hpp"
#include "numesh/ops/reference/mlp.hpp"
#include "test_util.hpp"

namespace numesh::ops {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

using testing::devices;
using testing::make_mesh;
using testing::mesh_case_name;
using testing::MeshCase;

using testing::matrix;
using testing::random_host;

class ShardedMlpTest : public ::testing::TestWithParam<MeshCase> {
 protected:
  runtime::DeviceMesh mesh() const { return make_mesh(GetParam()); }
};

// The sharded result against the dense reference (testing::matches_reference).
::testing::AssertionResult matches(const runtime::HostTensor& got, const RowMatrix& want,
                                   double bound) {
  return testing::matches_reference(
      got,
      runtime::HostTensor{.shape = got.shape,
                          .data = std::vector<float>(want.data(), want.data() + want.size())},
      bound);
}

TEST_P(ShardedMlpTest, EqualsTheDenseReferenceForEveryKindAndShape) {
  const auto m = mesh();
  // (tokens, hidden, intermediate): one that divides every mesh here, one where correction
  // replicates (6 tokens over 4 batch devices, 30 intermediate over tp=4).
  for (auto [t, h, f] : {std::tuple{8, 16, 32}, std::tuple{6, 12, 30}}) {
    for (MlpKind kind : kAllMlpKinds) {
      MlpWeights w;
      w.up = random_host({h, f}, 1, 0.3f);
      w.down = random_host({f, h}, 2, 0.3f);
      if (mlp_traits(kind).gated) w.gate = random_host({h, f}, 3, 0.3f);
      const runtime::HostTensor x = random_host({t, h}, 4, 1.0f);
      ShardedMlp mlp(m, kind, w, t);
      const RowMatrix want = mlp_reference(matrix(x), kind, w);
      const runtime::HostTensor y = mlp.forward(x);
      // The sharded sums run in another order (F split over tp, then the all-reduce): the
      // bound grows with the reduction length, max(1e-5, 2 * F * epsilon).
      const double bound = std::max(1e-5, 2.0 * f * std::numeric_limits<float>::epsilon());
      EXPECT_TRUE(matches(y, want, bound))
          << to_string(kind) << " T=" << t << " F=" << f << " up spec " << mlp.up_spec().repr();
      // Compiled once, runs again with the same result.
      EXPECT_EQ(mlp.forward(x), y);
    }
  }
}

TEST_P(ShardedMlpTest, SplitsFOverTpAndAllReducesOnlyWhenItDoes) {
  const auto m = mesh();
  const bool has_tp = m.mesh().has_axis("tp");
  MlpWeights w;
  w.up = random_host({16, 32}, 1, 0.3f);
  w.down = random_host({32, 16}, 2, 0.3f);
  ShardedMlp mlp(m, MlpKind::kGelu, w, 8);
  if (has_tp) {
    EXPECT_EQ(mlp.up_spec().repr(), "P(None, 'tp')");
    EXPECT_EQ(mlp.down_spec().repr(), "P('tp', None)");
    ASSERT_EQ(mlp.collectives().size(), 1u);
    EXPECT_EQ(mlp.collectives()[0].step.kind, sharding::ReshardStep::Kind::kAllReduce);
    EXPECT_EQ(mlp.collectives()[0].step.axes, std::vector<std::string>{"tp"});
  } else {
    EXPECT_TRUE(mlp.collectives().empty()) << "no tp axis: nothing to reduce";
  }
}

// Sequence parallelism (tokens also split over tp, Megatron style) and FSDP (weights split
// along H over fsdp, gathered every run): the same result as the dense MLP, with the
// collectives each scheme implies.
TEST_P(ShardedMlpTest, SequenceParallelAndFsdpEqualTheDenseReference) {
  const auto m = mesh();
  const std::int64_t t = 8, h = 16, f = 32;
  MlpWeights w;
  w.gate = random_host({h, f}, 3, 0.3f);
  w.up = random_host({h, f}, 1, 0.3f);
  w.down = random_host({f, h}, 2, 0.3f);
  const runtime::HostTensor x = random_host({t, h}, 4, 1.0f);
  const RowMatrix want =
      mlp_swiglu_reference(matrix(x), matrix(w.gate), matrix(w.up), matrix(w.down));
  const double bound = std::max(1e-5, 2.0 * f * std::numeric_limits<float>::epsilon());
  using Kind = sharding::ReshardStep::Kind;
  auto kinds = [](const ShardedMlp& mlp) {
    std::vector<Kind> k;
    for (const CollectivePlan& c : mlp.collectives()) k.push_back(c.step.kind);
    return k;
  };
  const bool has_tp = m.mesh().has_axis("tp") && m.mesh().axis_size("tp") > 1;
  const bool has_fsdp = m.mesh().has_axis("fsdp");

  ShardedMlp sp(m, MlpKind::kSwiGLU, w, t, MlpAxes{.batch = {"dp", "fsdp"}, .sequence = {"tp"}});
  EXPECT_TRUE(matches(sp.forward(x), want, bound)) << "sequence parallel";
  if (has_tp) {
    EXPECT_EQ(kinds(sp), (std::vector<Kind>{Kind::kAllGather, Kind::kReduceScatter}))
        << "tokens gathered before the up projection, partial sums reduce-scattered back";
  }

  ShardedMlp zero(m, MlpKind::kSwiGLU, w, t, MlpAxes{.batch = {"dp"}, .weights = {"fsdp"}});
  EXPECT_TRUE(matches(zero.forward(x), want, bound)) << "fsdp weights";
  if (has_fsdp) {
    EXPECT_EQ(zero.up_spec().repr(), "P('fsdp', 'tp')") << "stored split along H";
    const auto k = kinds(zero);
    EXPECT_EQ(std::count(k.begin(), k.end(), Kind::kAllGather), 3) << "gate, up and down gathered";
  }
}

// Llama's mlp_bias: every device adds its columns' slice of the gate and up biases (split like
// F over tp), and the down bias is added once, by the first device of each partial sum, before
// the all-reduce (or the reduce-scatter of sequence parallelism); with FSDP too.
TEST_P(ShardedMlpTest, BiasesEqualTheDenseReference) {
  const auto m = mesh();
  for (auto [t, h, f] : {std::tuple{8, 16, 32}, std::tuple{6, 12, 30}}) {
    for (MlpKind kind : kAllMlpKinds) {
      MlpWeights w;
      w.up = random_host({h, f}, 1, 0.3f);
      w.down = random_host({f, h}, 2, 0.3f);
      w.up_bias = random_host({f}, 5, 0.5f);
      w.down_bias = random_host({h}, 6, 0.5f);
      if (mlp_traits(kind).gated) {
        w.gate = random_host({h, f}, 3, 0.3f);
        w.gate_bias = random_host({f}, 7, 0.5f);
      }
      const runtime::HostTensor x = random_host({t, h}, 4, 1.0f);
      const RowMatrix want = mlp_reference(matrix(x), kind, w);
      const double bound = std::max(1e-5, 2.0 * f * std::numeric_limits<float>::epsilon());
      for (const auto& [label, axes] :
           {std::pair{"default axes", MlpAxes{}},
            std::pair{"sequence parallel", MlpAxes{.batch = {"dp", "fsdp"}, .sequence = {"tp"}}},
            std::pair{"fsdp weights", MlpAxes{.batch = {"dp"}, .weights = {"fsdp"}}}}) {
        ShardedMlp mlp(m, kind, w, t, axes);
        EXPECT_TRUE(matches(mlp.forward(x), want, bound))
            << to_string(kind) << " T=" << t << " F=" << f << " " << label << ", up spec "
            << mlp.up_spec().repr();
      }
      // Without the biases the MLP is another one: the check sees them.
      MlpWeights plain = w;
      plain.gate_bias = plain.up_bias = plain.down_bias = {};
      const RowMatrix without = mlp_reference(matrix(x), kind, plain);
      const auto values = [](const RowMatrix& r) {
        return std::span<const float>(r.data(), static_cast<std::size_t>(r.size()));
      };
      EXPECT_FALSE(numesh::testing::within_abs(values(without), values(want), 1e-3));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Meshes, ShardedMlpTest,
                         ::testing::Values(MeshCase{{1}, {"tp"}}, MeshCase{{2}, {"tp"}},
                                           MeshCase{{2}, {"dp"}}, MeshCase{{2, 2}, {"dp", "tp"}},
                                           MeshCase{{4}, {"tp"}}, MeshCase{{2, 4}, {"dp", "tp"}},
                                           MeshCase{{2, 2, 2}, {"dp", "fsdp", "tp"}}),
                         mesh_case_name);

TEST(ShardedMlpErrorsTest, BadWeightsAndInputsNameTheShapes) {
  const auto m = runtime::DeviceMesh::create(devices(2), {2}, {"tp"});
  MlpWeights w;
  w.up = random_host({16, 32}, 1, 0.3f);
  w.down = random_host({31, 16}, 2, 0.3f);
  EXPECT_THAT(
      [&] { ShardedMlp(m, MlpKind::kGelu, w, 8); },
      ThrowsMessage<ShapeError>(HasSubstr(
          "mlp (gelu): up [16, 32] and down [31, 16] do not chain (expected down [32, 16])")));
  w.down = random_host({32, 16}, 2, 0.3f);
  EXPECT_THAT([&] { ShardedMlp(m, MlpKind::kSwiGLU, w, 8); },
              ThrowsMessage<ShapeError>(HasSubstr("mlp (swiglu): gate [] and up [16, 32] differ")));
  EXPECT_THAT([&] { ShardedMlp(m, MlpKind::kGelu, w, 0); },
              ThrowsMessage<ShapeError>(HasSubstr("0 tokens; need at least one")));
  // An empty hidden or intermediate dim is refused, never divided by.
  const MlpWeights empty{.gate = {},
                         .up = runtime::HostTensor::zeros({0, 32}),
                         .down = runtime::HostTensor::zeros({32, 0})};
  EXPECT_THAT([&] { ShardedMlp(m, MlpKind::kGelu, empty, 8); },
              ThrowsMessage<ShapeError>(
                  "mlp (gelu): up [0, 32] has an empty dim; the hidden and intermediate sizes "
                  "must be positive"));
  // Misshapen biases, in the layer and in the reference alike.
  MlpWeights biased = w;
  biased.gate = random_host({16, 32}, 3, 0.3f);
  biased.up_bias = random_host({31}, 4, 0.5f);
  const auto up_bias_message = "mlp (swiglu): up_bias [31] must be [32] (intermediate) or empty";
  EXPECT_THAT([&] { ShardedMlp(m, MlpKind::kSwiGLU, biased, 8); },
              ThrowsMessage<ShapeError>(up_bias_message));
  EXPECT_THAT([&] { (void)mlp_reference(RowMatrix::Zero(8, 16), MlpKind::kSwiGLU, biased); },
              ThrowsMessage<ShapeError>(up_bias_message));
  biased.up_bias = {};
  biased.down_bias = random_host({32}, 4, 0.5f);
  EXPECT_THAT(
      [&] { ShardedMlp(m, MlpKind::kGelu, biased, 8); },
      ThrowsMessage<ShapeError>("mlp (gelu): down_bias [32] must be [16] (hidden) or empty"));
  biased.down_bias = {};
  biased.gate_bias = random_host({32}, 4, 0.5f);
  EXPECT_THAT(
      [&] { ShardedMlp(m, MlpKind::kGelu, biased, 8); },
      ThrowsMessage<ShapeError>("mlp (gelu): gate_bias [32] given, but a gelu MLP has no gate"));
  ShardedMlp mlp(m, MlpKind::kGelu, w, 8);
  EXPECT_THAT(
      [&] {
        mlp.forward(random_host({4, 16}, 5, 1.0f));
      },
      ThrowsMessage<ShapeError>(
          HasSubstr("mlp: input is [4, 16] but the MLP was compiled for [8, 16]")));
}

}  // namespace
}  // namespace numesh::ops
