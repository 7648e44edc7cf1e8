// The sharded backward passes against the dense references' gradients (reference/backward.hpp,
// themselves checked against PyTorch's autograd by ops_backward_matches_pytorch), on many mesh
// shapes and axis choices, and the collectives each one emits: the forward's, transposed.

#include "numesh/ops/reference/backward.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "numesh/core/error.hpp"
#include "numesh/ops/lowering/attention.hpp"
#include "numesh/ops/lowering/cross_entropy.hpp"
#include "numesh/ops/lowering/embedding.hpp"
#include "numesh/ops/lowering/gradients.hpp"
#include "numesh/ops/lowering/layernorm.hpp"
#include "numesh/ops/lowering/mlp.hpp"
#include "numesh/ops/lowering/rmsnorm.hpp"
#include "numesh/ops/reference/norms.hpp"
#include "numesh/sharding/corrected_sharding.hpp"
#include "test_util.hpp"

namespace numesh::ops {
namespace {

using sharding::Placement;
using ::testing::HasSubstr;
using testing::make_mesh;
using testing::mesh_case_name;
using testing::MeshCase;
using ::testing::ThrowsMessage;

runtime::HostTensor random(std::vector<std::int64_t> shape, std::uint32_t seed, float scale) {
  return testing::random_host(std::move(shape), seed, scale);
}

// ---- The placement rule -------------------------------------------------------------------

TEST(GradientPlacementsTest, ShardStaysReplicateStaysPartialBecomesReplicate) {
  EXPECT_EQ(
      gradient_placements({Placement::shard(0), Placement::replicate(), Placement::partial()}),
      (std::vector<Placement>{Placement::shard(0), Placement::replicate(),
                              Placement::replicate()}));
  EXPECT_EQ(gradient_placements({Placement::partial(sharding::PartialOp::kMax)}),
            (std::vector<Placement>{Placement::replicate()}));
}

TEST(GradientPlacementsTest, AWeightGradientIsPartialOverTheAxesSplittingTheTokens) {
  // Mesh (dp, fsdp, tp); x [T, H] split over (dp, fsdp) on its rows; the weight [F, H] used
  // split over tp on F.
  const std::vector<Placement> x{Placement::shard(0), Placement::shard(0, 1),
                                 Placement::replicate()};
  const std::vector<Placement> w{Placement::replicate(), Placement::replicate(),
                                 Placement::shard(0)};
  EXPECT_EQ(
      weight_gradient_placements(w, x, 2),
      (std::vector<Placement>{Placement::partial(), Placement::partial(), Placement::shard(0)}));
  // An axis splitting x's last dim (H) is not a token axis: no sum over it.
  EXPECT_EQ(weight_gradient_placements({Placement::replicate()}, {Placement::shard(1)}, 2),
            (std::vector<Placement>{Placement::replicate()}));
}

// ---- The MLP ------------------------------------------------------------------------------

struct MlpRun {
  runtime::HostTensor dx, dgate, dup, ddown;             // the weights' gradients as [in, out]
  runtime::HostTensor dgate_bias, dup_bias, ddown_bias;  // [n], where the layer has them
  std::vector<sharding::ReshardStep::Kind> collectives;
};

// Forward and backward of one MLP as one program on `mesh`: x [T, H] split over the batch and
// sequence axes as ShardedMlp splits it, y, then dy in y's layout and the backward.
MlpRun run_mlp_backward(const runtime::DeviceMesh& mesh, MlpKind kind, const MlpWeights& w,
                        const runtime::HostTensor& x, const runtime::HostTensor& dy,
                        const MlpAxes& axes) {
  const MlpLayer layer = MlpLayer::create(mesh, kind, w, axes);
  const MlpGradients grads = MlpGradients::like(layer);
  ProgramBuilder pb(mesh, "mlp backward");
  std::vector<std::string> token_axes = axes.batch;
  token_axes.insert(token_axes.end(), axes.sequence.begin(), axes.sequence.end());
  const sharding::PartitionSpec spec =
      sharding::correct_spec(
          x.shape,
          sharding::PartitionSpec({testing::entry_over(mesh, token_axes), sharding::AxisRule()}),
          mesh.mesh())
          .spec;
  runtime::Frontier x_loaded, dy_loaded;
  runtime::ShardedTensor& xs = pb.input("x", x.shape, spec, x_loaded);
  runtime::ShardedTensor& ys = pb.tensor("y", TensorRole::kOutput, x.shape, spec);
  MlpSaved saved;
  const runtime::Frontier forward = emit_mlp(pb, layer, xs, x_loaded, ys, "mlp", &saved);
  runtime::ShardedTensor& dys = pb.input("dy", x.shape, spec, dy_loaded);
  runtime::ShardedTensor& dxs = pb.tensor("dx", TensorRole::kOutput, x.shape, spec);
  const runtime::Frontier start = pb.join("backward.start", {&forward, &dy_loaded});
  const runtime::Frontier done =
      emit_mlp_backward(pb, layer, saved, dys, start, dxs, grads, "mlp.bwd");
  pb.output("dx", dxs, done);
  auto out = [&](const std::string& name, const std::shared_ptr<runtime::ShardedTensor>& g) {
    if (g) pb.output(name, pb.use(name, TensorRole::kOutput, g), done);
  };
  out("dgate", grads.gate);
  out("dup", grads.up);
  out("ddown", grads.down);
  out("dgate_bias", grads.gate_bias);
  out("dup_bias", grads.up_bias);
  out("ddown_bias", grads.down_bias);
  Program program = std::move(pb).compile();
  MlpRun run;
  for (const CollectivePlan& c : program.plan().collectives) {
    if (c.name.rfind("mlp.bwd", 0) == 0) run.collectives.push_back(c.step.kind);
  }
  program.set_input("x", x);
  program.set_input("dy", dy);
  program.run();
  run.dx = program.output("dx");
  run.dup = transposed(program.output("dup"));
  run.ddown = transposed(program.output("ddown"));
  if (grads.gate) run.dgate = transposed(program.output("dgate"));
  // A bias' gradient [1, n] as the reference shapes it, [n].
  const auto row = [&](const std::string& name, const std::shared_ptr<runtime::ShardedTensor>& g) {
    if (!g) return runtime::HostTensor{};
    runtime::HostTensor t = program.output(name);
    t.shape = {t.shape[1]};
    return t;
  };
  run.dgate_bias = row("dgate_bias", grads.gate_bias);
  run.dup_bias = row("dup_bias", grads.up_bias);
  run.ddown_bias = row("ddown_bias", grads.down_bias);
  return run;
}

class ShardedMlpBackwardTest : public ::testing::TestWithParam<MeshCase> {};

// Every axis choice of the forward: the default (tokens over dp, fsdp; F over tp), sequence
// parallel over tp, and weights stored split over fsdp (ZeRO-3). Both kinds; two shapes, one
// that divides every mesh here and one where eformer's correction replicates.
TEST_P(ShardedMlpBackwardTest, GradientsEqualTheDenseReference) {
  const runtime::DeviceMesh mesh = make_mesh(GetParam());
  for (auto [t, h, f] : {std::tuple{8, 16, 32}, std::tuple{6, 12, 30}}) {
    for (const auto& [kind, biases] :
         {std::pair{MlpKind::kSwiGLU, false}, std::pair{MlpKind::kGelu, false},
          std::pair{MlpKind::kGeGLU, false}, std::pair{MlpKind::kSwiGLU, true},
          std::pair{MlpKind::kGelu, true}, std::pair{MlpKind::kGeGLU, true}}) {
      MlpWeights w;
      w.up = random({h, f}, 1, 0.3f);
      w.down = random({f, h}, 2, 0.3f);
      if (mlp_traits(kind).gated) w.gate = random({h, f}, 3, 0.3f);
      if (biases) {  // Llama's mlp_bias (and GELU MLPs' usual biases)
        w.up_bias = random({f}, 6, 0.5f);
        w.down_bias = random({h}, 7, 0.5f);
        if (mlp_traits(kind).gated) w.gate_bias = random({f}, 8, 0.5f);
      }
      const runtime::HostTensor x = random({t, h}, 4, 1.0f), dy = random({t, h}, 5, 1.0f);
      const MlpGrads want = mlp_backward(x, kind, w, dy);
      // The sums run over T rows, F and H in another order than float64's: the forward's bound.
      const double bound =
          std::max(1e-5, 4.0 * std::max(f, t) * std::numeric_limits<float>::epsilon());
      for (const auto& [label, axes] :
           {std::pair{"default axes", MlpAxes{}},
            std::pair{"sequence parallel", MlpAxes{.batch = {"dp", "fsdp"}, .sequence = {"tp"}}},
            std::pair{"fsdp weights", MlpAxes{.batch = {"dp", "fsdp"}, .weights = {"fsdp"}}}}) {
        const MlpRun got = run_mlp_backward(mesh, kind, w, x, dy, axes);
        const std::string where = fmt::format("{}{} T={} F={} {}", to_string(kind),
                                              biases ? " with biases" : "", t, f, label);
        EXPECT_TRUE(testing::matches_reference(got.dx, want.dx, bound)) << where << ": dx";
        EXPECT_TRUE(testing::matches_reference(got.dup, want.dup, bound)) << where << ": d up";
        EXPECT_TRUE(testing::matches_reference(got.ddown, want.ddown, bound))
            << where << ": d down";
        if (kind == MlpKind::kSwiGLU) {
          EXPECT_TRUE(testing::matches_reference(got.dgate, want.dgate, bound))
              << where << ": d gate";
        }
        if (biases) {
          EXPECT_TRUE(testing::matches_reference(got.dup_bias, want.dup_bias, bound))
              << where << ": d up bias";
          EXPECT_TRUE(testing::matches_reference(got.ddown_bias, want.ddown_bias, bound))
              << where << ": d down bias";
          if (kind == MlpKind::kSwiGLU) {
            EXPECT_TRUE(testing::matches_reference(got.dgate_bias, want.dgate_bias, bound))
                << where << ": d gate bias";
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Meshes, ShardedMlpBackwardTest,
                         ::testing::Values(MeshCase{{1}, {"tp"}}, MeshCase{{2}, {"tp"}},
                                           MeshCase{{2}, {"dp"}}, MeshCase{{2}, {"fsdp"}},
                                           MeshCase{{4}, {"tp"}}, MeshCase{{2, 2}, {"dp", "tp"}},
                                           MeshCase{{2, 2}, {"fsdp", "tp"}},
                                           MeshCase{{2, 2, 2}, {"dp", "fsdp", "tp"}}),
                         mesh_case_name);

// The collectives are the forward's transposed: on (dp 2, tp 2) the default axes give the
// forward's all-reduce of y a free backward, all-reduce dx over tp (x was used whole by both
// halves of F) and all-reduce the weights' gradients over dp; sequence parallelism gathers dy
// and reduce-scatters dx; FSDP reduce-scatters the gradients of weights it gathered.
TEST(ShardedMlpBackwardCollectivesTest, AreTheForwardsTransposed) {
  using Kind = sharding::ReshardStep::Kind;
  const runtime::DeviceMesh mesh = make_mesh(MeshCase{{2, 2}, {"dp", "tp"}});
  MlpWeights w;
  w.gate = random({16, 32}, 3, 0.3f);
  w.up = random({16, 32}, 1, 0.3f);
  w.down = random({32, 16}, 2, 0.3f);
  const runtime::HostTensor x = random({8, 16}, 4, 1.0f), dy = random({8, 16}, 5, 1.0f);
  auto count = [](const std::vector<Kind>& kinds, Kind k) {
    return std::count(kinds.begin(), kinds.end(), k);
  };

  const MlpRun plain = run_mlp_backward(mesh, MlpKind::kSwiGLU, w, x, dy, MlpAxes{});
  EXPECT_EQ(count(plain.collectives, Kind::kAllReduce), 4)
      << "dx over tp, three weight gradients over dp";
  EXPECT_EQ(plain.collectives.size(), 4u);

  const MlpRun sp = run_mlp_backward(mesh, MlpKind::kSwiGLU, w, x, dy,
                                     MlpAxes{.batch = {"dp"}, .sequence = {"tp"}});
  EXPECT_EQ(count(sp.collectives, Kind::kAllGather), 1)
      << "dy gathered over tp (the reduce-scatter's transpose)";
  EXPECT_EQ(count(sp.collectives, Kind::kReduceScatter), 1)
      << "dx reduce-scattered (the all-gather's transpose)";

  const runtime::DeviceMesh zero_mesh = make_mesh(MeshCase{{2, 2}, {"fsdp", "tp"}});
  const MlpRun zero = run_mlp_backward(zero_mesh, MlpKind::kSwiGLU, w, x, dy,
                                       MlpAxes{.batch = {"fsdp"}, .weights = {"fsdp"}});
  EXPECT_EQ(count(zero.collectives, Kind::kReduceScatter), 3)
      << "each weight's gradient back to its fsdp shard";
}

TEST(ShardedMlpBackwardErrorsTest, RefusesWhatItCannotDifferentiate) {
  const runtime::DeviceMesh mesh = make_mesh(MeshCase{{2}, {"tp"}});
  MlpWeights w;
  w.up = random({16, 32}, 1, 0.3f);
  w.down = random({32, 16}, 2, 0.3f);
  w.up_bias = random({32}, 3, 0.1f);
  const MlpLayer with_bias = MlpLayer::create(mesh, MlpKind::kGelu, w);
  MlpGradients no_bias_grad = MlpGradients::like(with_bias);
  no_bias_grad.up_bias = nullptr;
  {
    ProgramBuilder fb(mesh, "a bias without its gradient");
    const sharding::PartitionSpec whole({sharding::AxisRule(), sharding::AxisRule()});
    runtime::Frontier loaded;
    runtime::ShardedTensor& xs = fb.input("x", {4, 16}, whole, loaded);
    runtime::ShardedTensor& ys = fb.tensor("y", TensorRole::kActivation, {4, 16}, whole);
    runtime::ShardedTensor& dxs = fb.tensor("dx", TensorRole::kActivation, {4, 16}, whole);
    MlpSaved kept;
    const runtime::Frontier forward = emit_mlp(fb, with_bias, xs, loaded, ys, "mlp", &kept);
    EXPECT_THAT(
        [&] { emit_mlp_backward(fb, with_bias, kept, ys, forward, dxs, no_bias_grad, "mlp.bwd"); },
        ThrowsMessage<ValueError>(
            HasSubstr("mlp.bwd: the layer has the up bias but no gradient is given for it")));
  }
  w.up_bias = {};
  const MlpLayer layer = MlpLayer::create(mesh, MlpKind::kGelu, w);
  ProgramBuilder pb(mesh, "no saved");
  runtime::ShardedTensor& dy = pb.tensor("dy", TensorRole::kActivation, {4, 16}, {});
  EXPECT_THAT(
      [&] {
        emit_mlp_backward(pb, layer, MlpSaved{}, dy, {}, dy, MlpGradients::like(layer), "mlp.bwd");
      },
      ThrowsMessage<ValueError>(HasSubstr("mlp.bwd: the forward kept nothing for the backward")));
}

// ---- RMSNorm, the embedding, the LM head's cross-entropy --------------------------------

// The spec of [rows, ...] activations split over the mesh's dp and fsdp axes (eformer's
// correction for `rows`).
sharding::PartitionSpec rows_spec(const runtime::DeviceMesh& mesh,
                                  std::vector<std::int64_t> shape) {
  return sharding::correct_spec(
             shape, sharding::PartitionSpec({testing::entry_over(mesh, {"dp", "fsdp"})}),
             mesh.mesh())
      .spec;
}

class ShardedBackwardTest : public ::testing::TestWithParam<MeshCase> {};

TEST_P(ShardedBackwardTest, RmsNormGradientsEqualTheDenseReference) {
  const runtime::DeviceMesh mesh = make_mesh(GetParam());
  for (std::int64_t t : {8, 6}) {
    const std::int64_t h = 24;
    const float eps = 1e-5f;
    const runtime::HostTensor x = random({t, h}, 1, 1.0f), w = random({1, h}, 2, 0.5f);
    const runtime::HostTensor dy = random({t, h}, 3, 1.0f), residual = random({t, h}, 4, 1.0f);
    const RmsNormGrads want = rmsnorm_backward(x, w, dy, eps);
    ProgramBuilder pb(mesh, "rmsnorm backward");
    const sharding::PartitionSpec spec = rows_spec(mesh, x.shape);
    runtime::Frontier x_in, dy_in, r_in;
    runtime::ShardedTensor& xs = pb.input("x", x.shape, spec, x_in);
    runtime::ShardedTensor& dys = pb.input("dy", x.shape, spec, dy_in);
    runtime::ShardedTensor& rs = pb.input("residual", x.shape, spec, r_in);
    auto weight =
        std::make_shared<runtime::ShardedTensor>(mesh, w.shape, sharding::PartitionSpec());
    runtime::scatter(w, *weight);
    runtime::ShardedTensor& ws = pb.use("w", TensorRole::kWeight, weight);
    runtime::ShardedTensor& dws = pb.use("dw", TensorRole::kOutput, gradient_like(*weight));
    runtime::ShardedTensor& dxs = pb.tensor("dx", TensorRole::kOutput, x.shape, spec);
    const runtime::Frontier start = pb.join("start", {&x_in, &dy_in, &r_in});
    const runtime::Frontier done =
        emit_rmsnorm_backward(pb, xs, ws, dys, &rs, dxs, dws, {.eps = eps}, start, "norm.bwd");
    pb.output("dx", dxs, done);
    pb.output("dw", dws, done);
    Program program = std::move(pb).compile();
    program.set_input("x", x);
    program.set_input("dy", dy);
    program.set_input("residual", residual);
    program.run();
    runtime::HostTensor want_dx = want.dx;
    for (std::size_t i = 0; i < want_dx.data.size(); ++i) want_dx.data[i] += residual.data[i];
    EXPECT_TRUE(testing::matches_reference(program.output("dx"), want_dx, 1e-5)) << "T=" << t;
    EXPECT_TRUE(testing::matches_reference(program.output("dw"), want.dweight, 1e-5)) << "T=" << t;
  }
}

// LayerNorm forward and backward as one program, with and without a bias, rows offset by 50
// (a mean far from 0: the variance must come from centred values), against the references.
TEST_P(ShardedBackwardTest, LayerNormForwardAndGradientsEqualTheDenseReference) {
  const runtime::DeviceMesh mesh = make_mesh(GetParam());
  const std::int64_t h = 24;
  const float eps = 1e-5f;
  for (const std::int64_t t : {8, 6}) {
    for (const bool with_bias : {true, false}) {
      runtime::HostTensor x = random({t, h}, 1, 1.0f);
      for (float& v : x.data) v += 50.0f;
      const runtime::HostTensor w = random({1, h}, 2, 0.5f), b = random({1, h}, 5, 0.5f);
      const runtime::HostTensor dy = random({t, h}, 3, 1.0f);
      const LayerNormGrads want = layernorm_backward(x, w, dy, eps);
      const RowMatrix want_y = layernorm_reference(
          ConstMatrixMap(x.data.data(), t, h), ConstMatrixMap(w.data.data(), 1, h),
          with_bias ? RowMatrix(ConstMatrixMap(b.data.data(), 1, h)) : RowMatrix(), eps);
      ProgramBuilder pb(mesh, "layernorm");
      const sharding::PartitionSpec spec = rows_spec(mesh, x.shape);
      runtime::Frontier x_in, dy_in;
      runtime::ShardedTensor& xs = pb.input("x", x.shape, spec, x_in);
      runtime::ShardedTensor& dys = pb.input("dy", x.shape, spec, dy_in);
      auto weight =
          std::make_shared<runtime::ShardedTensor>(mesh, w.shape, sharding::PartitionSpec());
      auto bias =
          std::make_shared<runtime::ShardedTensor>(mesh, b.shape, sharding::PartitionSpec());
      runtime::scatter(w, *weight);
      runtime::scatter(b, *bias);
      runtime::ShardedTensor& ws = pb.use("w", TensorRole::kWeight, weight);
      runtime::ShardedTensor* bs = with_bias ? &pb.use("b", TensorRole::kWeight, bias) : nullptr;
      runtime::ShardedTensor& ys = pb.tensor("y", TensorRole::kOutput, x.shape, spec);
      runtime::ShardedTensor& dws = pb.use("dw", TensorRole::kOutput, gradient_like(*weight));
      runtime::ShardedTensor& dbs = pb.use("db", TensorRole::kOutput, gradient_like(*weight));
      runtime::ShardedTensor& dxs = pb.tensor("dx", TensorRole::kOutput, x.shape, spec);
      const runtime::Frontier fwd = emit_layernorm(pb, xs, ws, bs, ys, eps, x_in, "ln");
      pb.output("y", ys, fwd);
      const runtime::Frontier start = pb.join("start", {&fwd, &dy_in});
      // Without a bias its gradient is not asked for either (the kernel's no-bias path).
      const runtime::Frontier done = emit_layernorm_backward(
          pb, xs, ws, dys, dxs, dws, with_bias ? &dbs : nullptr, eps, start, "ln.bwd");
      pb.output("dx", dxs, done);
      pb.output("dw", dws, done);
      pb.output("db", dbs, done);
      Program program = std::move(pb).compile();
      program.set_input("x", x);
      program.set_input("dy", dy);
      program.run();
      const std::string where = fmt::format("T={} bias {}", t, with_bias);
      runtime::HostTensor want_y_host = runtime::HostTensor::zeros({t, h});
      std::copy_n(want_y.data(), t * h, want_y_host.data.begin());
      EXPECT_TRUE(testing::matches_reference(program.output("y"), want_y_host, 1e-5)) << where;
      EXPECT_TRUE(testing::matches_reference(program.output("dx"), want.dx, 1e-4)) << where;
      EXPECT_TRUE(testing::matches_reference(program.output("dw"), want.dweight, 1e-5)) << where;
      if (with_bias) {
        EXPECT_TRUE(testing::matches_reference(program.output("db"), want.dbias, 1e-5)) << where;
      }
    }
  }
}

TEST(LayerNormErrorsTest, MisshapenOperandsAreNamed) {
  const runtime::DeviceMesh mesh = make_mesh(MeshCase{{2}, {"tp"}});
  ProgramBuilder pb(mesh, "layernorm");
  runtime::Frontier in;
  runtime::ShardedTensor& x = pb.input("x", {4, 8}, sharding::PartitionSpec(), in);
  runtime::ShardedTensor& short_out =
      pb.tensor("short", TensorRole::kActivation, {2, 8}, sharding::PartitionSpec());
  runtime::ShardedTensor& out =
      pb.tensor("y", TensorRole::kActivation, {4, 8}, sharding::PartitionSpec());
  runtime::ShardedTensor& h_split =
      pb.input("h_split", {4, 8},
               sharding::PartitionSpec({sharding::AxisRule(), sharding::AxisRule("tp")}), in);
  auto w = std::make_shared<runtime::ShardedTensor>(mesh, std::vector<std::int64_t>{1, 8},
                                                    sharding::PartitionSpec());
  auto wide = std::make_shared<runtime::ShardedTensor>(mesh, std::vector<std::int64_t>{1, 9},
                                                       sharding::PartitionSpec());
  runtime::ShardedTensor& ws = pb.use("w", TensorRole::kWeight, w);
  runtime::ShardedTensor& wides = pb.use("wide", TensorRole::kWeight, wide);
  EXPECT_THAT([&] { emit_layernorm(pb, x, ws, nullptr, short_out, 1e-5f, in, "ln"); },
              ThrowsMessage<ShapeError>(
                  "ln: x 4x8 P(), 2x8 P() and 2x8 P() must be laid out alike, H whole"));
  EXPECT_THAT([&] { emit_layernorm(pb, h_split, ws, nullptr, h_split, 1e-5f, in, "ln"); },
              ThrowsMessage<ShapeError>(HasSubstr("must be laid out alike, H whole")));
  EXPECT_THAT([&] { emit_layernorm(pb, x, ws, &wides, out, 1e-5f, in, "ln"); },
              ThrowsMessage<ShapeError>("ln: the bias is 1x9 P(), expected a replicated [1, 8]"));
  EXPECT_THAT(
      [&] { emit_layernorm_backward(pb, x, ws, out, out, wides, nullptr, 1e-5f, in, "ln.bwd"); },
      ThrowsMessage<ShapeError>(HasSubstr(
          "ln.bwd: the weight's gradient is [1, 9] P() but must be laid out as [1, 8] P()")));
}

TEST_P(ShardedBackwardTest, EmbeddingGradientEqualsTheDenseReference) {
  const runtime::DeviceMesh mesh = make_mesh(GetParam());
  const std::int64_t vocab = 12, h = 8;
  for (std::vector<std::int32_t> ids : {std::vector<std::int32_t>{3, 0, 3, 9, 3, 7, 11, 3},
                                        std::vector<std::int32_t>{5, 5, 1, 10, 2, 5}}) {
    const auto t = static_cast<std::int64_t>(ids.size());
    const runtime::HostTensor dx = random({t, h}, 1, 1.0f);
    const EmbeddingLayer layer =
        EmbeddingLayer::create(mesh, EmbeddingWeights{.table = random({vocab, h}, 2, 1.0f)});
    ProgramBuilder pb(mesh, "embedding backward");
    runtime::Frontier in;
    runtime::ShardedTensor& dxs = pb.input("dx", dx.shape, rows_spec(mesh, dx.shape), in);
    runtime::ShardedTensor& grad =
        pb.use("d_table", TensorRole::kOutput, gradient_like(*layer.table));
    pb.output("d_table", grad,
              emit_embedding_backward(pb, layer, &ids, dxs, in, grad, "embedding.bwd"));
    Program program = std::move(pb).compile();
    program.set_input("dx", dx);
    program.run();
    EXPECT_TRUE(testing::matches_reference(program.output("d_table"),
                                           embedding_backward(ids, vocab, dx), 1e-6))
        << "T=" << t;
  }
}

TEST_P(ShardedBackwardTest, CrossEntropyLossAndGradientsEqualTheDenseReference) {
  const runtime::DeviceMesh mesh = make_mesh(GetParam());
  const std::int64_t h = 16, vocab = 24;
  for (std::vector<std::int32_t> targets : {std::vector<std::int32_t>{0, 23, 5, 5, 17, 12, 1, 8},
                                            std::vector<std::int32_t>{22, 3, 3, 9, 14, 0}}) {
    const auto t = static_cast<std::int64_t>(targets.size());
    const runtime::HostTensor x = random({t, h}, 1, 1.0f), w = random({h, vocab}, 2, 0.5f);
    const CrossEntropyGrads want = lm_head_cross_entropy(x, w, targets);
    const LmHeadLayer layer = LmHeadLayer::create(mesh, LmHeadWeights{.weight = w});
    ProgramBuilder pb(mesh, "cross entropy");
    const sharding::PartitionSpec spec = rows_spec(mesh, x.shape);
    runtime::Frontier in;
    runtime::ShardedTensor& xs = pb.input("x", x.shape, spec, in);
    runtime::ShardedTensor& losses = pb.tensor("losses", TensorRole::kOutput, {t, 1}, spec);
    runtime::ShardedTensor& dxs = pb.tensor("dx", TensorRole::kOutput, x.shape, spec);
    runtime::ShardedTensor& dws = pb.use("dw", TensorRole::kOutput, gradient_like(*layer.weight));
    CrossEntropySaved saved;
    const runtime::Frontier fwd =
        emit_lm_head_cross_entropy(pb, layer, xs, &targets, in, losses, "ce", &saved);
    pb.output("losses", losses, fwd);
    const runtime::Frontier bwd = emit_lm_head_cross_entropy_backward(
        pb, saved, 1.0 / static_cast<double>(t), fwd, dxs, dws, "ce.bwd");
    pb.output("dx", dxs, bwd);
    pb.output("dw", dws, bwd);
    Program program = std::move(pb).compile();
    program.set_input("x", x);
    program.run();
    double loss = 0.0;
    for (float l : program.output("losses").data) loss += l;
    loss /= static_cast<double>(t);
    EXPECT_NEAR(loss, want.loss, 1e-5 * std::abs(want.loss)) << "T=" << t;
    EXPECT_TRUE(testing::matches_reference(program.output("dx"), want.dx, 1e-5)) << "T=" << t;
    EXPECT_TRUE(testing::matches_reference(transposed(program.output("dw")), want.dw, 1e-5))
        << "T=" << t;
  }
}

INSTANTIATE_TEST_SUITE_P(Meshes, ShardedBackwardTest,
                         ::testing::Values(MeshCase{{1}, {"tp"}}, MeshCase{{2}, {"tp"}},
                                           MeshCase{{2}, {"dp"}}, MeshCase{{4}, {"tp"}},
                                           MeshCase{{2, 2}, {"dp", "tp"}},
                                           MeshCase{{2, 2}, {"fsdp", "tp"}},
                                           MeshCase{{2, 2, 2}, {"dp", "fsdp", "tp"}}),
                         mesh_case_name);

// ---- Attention ----------------------------------------------------------------------------

struct AttentionRun {
  runtime::HostTensor dx, dwq, dwk, dwv, dwo;  // the weights' gradients as [in, out]
  std::vector<sharding::ReshardStep::Kind> collectives;
};

AttentionRun run_attention_backward(const runtime::DeviceMesh& mesh, const AttentionConfig& config,
                                    const AttentionWeights& w, const runtime::HostTensor& x,
                                    const runtime::HostTensor& dy, const AttentionAxes& axes) {
  const AttentionLayer layer = AttentionLayer::create(mesh, config, w, axes);
  const AttentionGradients grads = AttentionGradients::like(layer);
  const sharding::PartitionSpec spec =
      sharding::correct_spec(
          x.shape,
          sharding::PartitionSpec({testing::entry_over(mesh, axes.batch),
                                   testing::entry_over(mesh, axes.sequence), sharding::AxisRule()}),
          mesh.mesh())
          .spec;
  ProgramBuilder pb(mesh, "attention backward");
  runtime::Frontier x_in, dy_in;
  runtime::ShardedTensor& xs = pb.input("x", x.shape, spec, x_in);
  runtime::ShardedTensor& ys = pb.tensor("y", TensorRole::kOutput, x.shape, spec);
  AttentionSaved saved;
  const runtime::Frontier forward = emit_attention(pb, layer, xs, x_in, ys, "attn", {}, &saved);
  runtime::ShardedTensor& dys = pb.input("dy", x.shape, spec, dy_in);
  runtime::ShardedTensor& dxs = pb.tensor("dx", TensorRole::kOutput, x.shape, spec);
  const runtime::Frontier start = pb.join("backward.start", {&forward, &dy_in});
  const runtime::Frontier done =
      emit_attention_backward(pb, layer, saved, dys, start, dxs, grads, "attn.bwd");
  pb.output("dx", dxs, done);
  for (const auto& [name, g] : {std::pair{"dwq", grads.wq}, std::pair{"dwk", grads.wk},
                                std::pair{"dwv", grads.wv}, std::pair{"dwo", grads.wo}}) {
    pb.output(name, pb.use(name, TensorRole::kOutput, g), done);
  }
  Program program = std::move(pb).compile();
  AttentionRun run;
  for (const CollectivePlan& c : program.plan().collectives) {
    if (c.name.rfind("attn.bwd", 0) == 0) run.collectives.push_back(c.step.kind);
  }
  program.set_input("x", x);
  program.set_input("dy", dy);
  program.run();
  run.dx = program.output("dx");
  run.dwq = transposed(program.output("dwq"));
  run.dwk = transposed(program.output("dwk"));
  run.dwv = transposed(program.output("dwv"));
  run.dwo = transposed(program.output("dwo"));
  return run;
}

class ShardedAttentionBackwardTest : public ::testing::TestWithParam<MeshCase> {};

// Causal GQA with RoPE, heads over tp (kv heads split with them on tp 2, shared on tp 4), the
// sequences over dp, the tokens over sp; T = 80 crosses the kernel's 64-query and 64-key blocks.
TEST_P(ShardedAttentionBackwardTest, GradientsEqualTheDenseReference) {
  const runtime::DeviceMesh mesh = make_mesh(GetParam());
  AttentionConfig c;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.rope_theta = 10000.0f;
  c.rope_scaling = RopeScaling{.kind = RopeScaling::Kind::kLinear, .factor = 2.0};
  const std::int64_t h = 16;
  AttentionWeights w;
  w.wq = random({h, 32}, 1, 0.3f);
  w.wk = random({h, 16}, 2, 0.3f);
  w.wv = random({h, 16}, 3, 0.3f);
  w.wo = random({32, h}, 4, 0.3f);
  for (std::int64_t t : {8, 80}) {
    const runtime::HostTensor x = random({2, t, h}, 5, 1.0f), dy = random({2, t, h}, 6, 1.0f);
    const AttentionGrads want = attention_layer_backward(x, w, c, dy);
    const double bound =
        std::max(1e-5, 8.0 * static_cast<double>(t) * std::numeric_limits<float>::epsilon());
    for (const auto& [label, axes] :
         {std::pair{"default axes", AttentionAxes{}},
          std::pair{"sequence parallel",
                    AttentionAxes{.batch = {"dp"}, .sequence = {"sp"}, .heads = "tp"}}}) {
      const AttentionRun got = run_attention_backward(mesh, c, w, x, dy, axes);
      const std::string where = fmt::format("T={} {}", t, label);
      EXPECT_TRUE(testing::matches_reference(got.dx, want.dx, bound)) << where << ": dx";
      EXPECT_TRUE(testing::matches_reference(got.dwq, want.dwq, bound)) << where << ": d wq";
      EXPECT_TRUE(testing::matches_reference(got.dwk, want.dwk, bound)) << where << ": d wk";
      EXPECT_TRUE(testing::matches_reference(got.dwv, want.dwv, bound)) << where << ": d wv";
      EXPECT_TRUE(testing::matches_reference(got.dwo, want.dwo, bound)) << where << ": d wo";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Meshes, ShardedAttentionBackwardTest,
                         ::testing::Values(MeshCase{{1}, {"tp"}}, MeshCase{{2}, {"tp"}},
                                           MeshCase{{4}, {"tp"}}, MeshCase{{2}, {"dp"}},
                                           MeshCase{{2}, {"sp"}}, MeshCase{{2, 2}, {"dp", "tp"}},
                                           MeshCase{{2, 2}, {"sp", "tp"}},
                                           MeshCase{{2, 2, 2}, {"dp", "sp", "tp"}}),
                         mesh_case_name);

TEST(ShardedAttentionBackwardCollectivesTest, AreTheForwardsTransposed) {
  using Kind = sharding::ReshardStep::Kind;
  AttentionConfig c;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  AttentionWeights w;
  w.wq = random({16, 32}, 1, 0.3f);
  w.wk = random({16, 16}, 2, 0.3f);
  w.wv = random({16, 16}, 3, 0.3f);
  w.wo = random({32, 16}, 4, 0.3f);
  const runtime::HostTensor x = random({2, 8, 16}, 5, 1.0f);
  auto count = [](const std::vector<Kind>& kinds, Kind k) {
    return std::count(kinds.begin(), kinds.end(), k);
  };
  // Heads and kv heads over tp 2: dx all-reduced over tp; nothing else crosses devices.
  const AttentionRun tp =
      run_attention_backward(make_mesh(MeshCase{{2}, {"tp"}}), c, w, x, x, AttentionAxes{});
  EXPECT_EQ(tp.collectives, std::vector<Kind>{Kind::kAllReduce});
  // Over tp 4 the two kv heads are shared: dk and dv all-reduced too.
  const AttentionRun shared =
      run_attention_backward(make_mesh(MeshCase{{4}, {"tp"}}), c, w, x, x, AttentionAxes{});
  EXPECT_EQ(count(shared.collectives, Kind::kAllReduce), 3)
      << "dk, dv and dx; the wk and wv gradients then agree on every device: nothing to reduce";
  EXPECT_EQ(shared.collectives.size(), 3u);
  // Tokens over sp: dk and dv reduce-scattered back (the gathers' transposes), the four
  // gradients all-reduced over sp.
  const AttentionRun sp =
      run_attention_backward(make_mesh(MeshCase{{2}, {"sp"}}), c, w, x, x,
                             AttentionAxes{.batch = {}, .sequence = {"sp"}, .heads = "tp"});
  EXPECT_EQ(count(sp.collectives, Kind::kReduceScatter), 2);
  EXPECT_EQ(count(sp.collectives, Kind::kAllReduce), 4);
}

}  // namespace
}  // namespace numesh::ops
