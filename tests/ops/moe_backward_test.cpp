// The sharded MoE backward against the dense reference's gradients (moe_backward, itself
// checked against PyTorch's autograd by ops_backward_matches_pytorch), per routing group, on
// meshes over dp, fsdp, ep and tp, with and without Qwen2-MoE's shared expert; the collectives
// it emits; what it refuses.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "numesh/core/error.hpp"
#include "numesh/ops/lowering/moe.hpp"
#include "numesh/ops/reference/backward.hpp"
#include "numesh/sharding/corrected_sharding.hpp"
#include "test_util.hpp"

namespace numesh::ops {
namespace {

using ::testing::HasSubstr;
using testing::make_mesh;
using testing::mesh_case_name;
using testing::MeshCase;
using testing::random_host;
using ::testing::ThrowsMessage;

// Rows [from, from + n) of x [T, H].
runtime::HostTensor rows_of(const runtime::HostTensor& x, std::int64_t from, std::int64_t n) {
  const std::int64_t h = x.shape[1];
  runtime::HostTensor part = runtime::HostTensor::zeros({n, h});
  std::copy_n(x.data.begin() + from * h, n * h, part.data.begin());
  return part;
}

// moe_backward applied to each routing group (consecutive blocks of rows): dx concatenated,
// the weights' gradients summed.
MoeGrads grouped_backward(const runtime::HostTensor& x, const MoeWeights& w, const MoeConfig& c,
                          const runtime::HostTensor& dy, std::int64_t groups) {
  const std::int64_t t = x.shape[0], h = x.shape[1], per = t / groups;
  MoeGrads sum;
  for (std::int64_t g = 0; g < groups; ++g) {
    const MoeGrads part = moe_backward(rows_of(x, g * per, per), w, c, rows_of(dy, g * per, per));
    if (g == 0) {
      sum = part;
      sum.dx = runtime::HostTensor::zeros(x.shape);
    } else {
      for (auto [to, from] :
           {std::pair{&sum.drouter, &part.drouter}, std::pair{&sum.dgate, &part.dgate},
            std::pair{&sum.dup, &part.dup}, std::pair{&sum.ddown, &part.ddown},
            std::pair{&sum.dshared_gate, &part.dshared_gate},
            std::pair{&sum.dshared_up, &part.dshared_up},
            std::pair{&sum.dshared_down, &part.dshared_down},
            std::pair{&sum.dshared_expert_gate, &part.dshared_expert_gate}}) {
        for (std::size_t i = 0; i < to->data.size(); ++i) to->data[i] += from->data[i];
      }
    }
    std::copy(part.dx.data.begin(), part.dx.data.end(), sum.dx.data.begin() + g * per * h);
  }
  return sum;
}

struct MoeRun {
  MoeGrads grads;
  std::vector<CollectivePlan> collectives;  // the backward's
};

// Forward and backward of one MoE layer as one program on `mesh`, x [T, H] split over
// axes.batch as ShardedMoe splits it; run once per (x, dy) pair, the last run's gradients kept.
MoeRun run_moe_backward(
    const runtime::DeviceMesh& mesh, const MoeConfig& c, const MoeWeights& w,
    const std::vector<std::pair<runtime::HostTensor, runtime::HostTensor>>& runs,
    const MoeAxes& axes = {}) {
  const MoeLayer layer = MoeLayer::create(mesh, c, w, axes);
  const MoeGradients grads = MoeGradients::like(layer);
  const runtime::HostTensor& x0 = runs.front().first;
  ProgramBuilder pb(mesh, "moe backward");
  const sharding::PartitionSpec spec =
      sharding::correct_spec(
          x0.shape,
          sharding::PartitionSpec({testing::entry_over(mesh, axes.batch), sharding::AxisRule()}),
          mesh.mesh())
          .spec;
  runtime::Frontier x_loaded, dy_loaded;
  runtime::ShardedTensor& xs = pb.input("x", x0.shape, spec, x_loaded);
  runtime::ShardedTensor& ys = pb.tensor("y", TensorRole::kOutput, x0.shape, spec);
  MoeSaved saved;
  const runtime::Frontier forward = emit_moe(pb, layer, xs, x_loaded, ys, "moe", nullptr, &saved);
  runtime::ShardedTensor& dys = pb.input("dy", x0.shape, spec, dy_loaded);
  runtime::ShardedTensor& dxs = pb.tensor("dx", TensorRole::kOutput, x0.shape, spec);
  const runtime::Frontier start = pb.join("backward.start", {&forward, &dy_loaded});
  const runtime::Frontier done =
      emit_moe_backward(pb, layer, saved, dys, start, dxs, grads, "moe.bwd");
  pb.output("dx", dxs, done);
  for (const auto& [name, g] :
       {std::pair{"drouter", grads.router}, std::pair{"dgate", grads.gate},
        std::pair{"dup", grads.up}, std::pair{"ddown", grads.down},
        std::pair{"dshared_gate", grads.shared_gate}, std::pair{"dshared_up", grads.shared_up},
        std::pair{"dshared_down", grads.shared_down},
        std::pair{"dshared_expert_gate", grads.shared_expert_gate}}) {
    if (g != nullptr) pb.output(name, pb.use(name, TensorRole::kOutput, g), done);
  }
  Program program = std::move(pb).compile();
  MoeRun run;
  for (const CollectivePlan& cp : program.plan().collectives) {
    if (cp.name.rfind("moe.bwd", 0) == 0) run.collectives.push_back(cp);
  }
  for (const auto& [x, dy] : runs) {
    program.set_input("x", x);
    program.set_input("dy", dy);
    program.run();
  }
  run.grads.dx = program.output("dx");
  run.grads.drouter = program.output("drouter");
  // Every matrix is stored out-in: as [in, out], as the reference's.
  run.grads.dgate = transposed(program.output("dgate"));
  run.grads.dup = transposed(program.output("dup"));
  run.grads.ddown = transposed(program.output("ddown"));
  if (layer.shared_expert) {
    run.grads.dshared_gate = transposed(program.output("dshared_gate"));
    run.grads.dshared_up = transposed(program.output("dshared_up"));
    run.grads.dshared_down = transposed(program.output("dshared_down"));
    run.grads.dshared_expert_gate = program.output("dshared_expert_gate");
  }
  return run;
}

// Every gradient of `got` equals `want`'s within `bound` (a shared expert's where the layer
// has one); `where` names the case in failures.
void expect_gradients_match(const MoeGrads& got, const MoeGrads& want, double bound,
                            const std::string& where) {
  const std::pair<const char*, const runtime::HostTensor MoeGrads::*> all[] = {
      {"dx", &MoeGrads::dx},
      {"d router", &MoeGrads::drouter},
      {"d gate", &MoeGrads::dgate},
      {"d up", &MoeGrads::dup},
      {"d down", &MoeGrads::ddown},
      {"d shared gate", &MoeGrads::dshared_gate},
      {"d shared up", &MoeGrads::dshared_up},
      {"d shared down", &MoeGrads::dshared_down},
      {"d shared_expert_gate", &MoeGrads::dshared_expert_gate}};
  for (const auto& [what, member] : all) {
    if ((want.*member).shape.empty()) continue;  // no shared expert
    EXPECT_TRUE(testing::matches_reference(got.*member, want.*member, bound))
        << where << ": " << what;
  }
}

// fp32 sums over at most T rows or max(H, F) terms, in another order than float64's.
double bound_for(std::int64_t t, std::int64_t h) {
  return std::max(
      1e-5, 4.0 * static_cast<double>(std::max(t, h)) * std::numeric_limits<float>::epsilon());
}

class ShardedMoeBackwardTest : public ::testing::TestWithParam<MeshCase> {};

// Experts split over ep, their F over tp, tokens over dp and fsdp (each split a routing group):
// Mixtral's top-2 renormalised dropless routing, top-2 with a capacity that drops, top-1
// without renormalisation. Each program runs twice on different tokens, so an expert that
// gets tokens in one run and none in the next shows stale gradients if any were left.
TEST_P(ShardedMoeBackwardTest, GradientsEqualTheDenseReferencePerRoutingGroup) {
  const runtime::DeviceMesh mesh = make_mesh(GetParam());
  const std::int64_t t = 16, h = 16, f = 8, e = 4;
  const MoeWeights w = testing::random_moe_weights(h, f, e);
  const std::int64_t groups = testing::expected_groups(GetParam(), {"dp", "fsdp"}, t);
  for (const MoeConfig& c :
       {MoeConfig{.num_experts = e, .top_k = 2},
        MoeConfig{.num_experts = e, .top_k = 2, .capacity_factor = 0.75f},
        MoeConfig{.num_experts = e, .top_k = 1, .capacity_factor = 1.0f, .renormalize = false}}) {
    const runtime::HostTensor x1 = random_host({t, h}, 1, 1.0f), dy1 = random_host({t, h}, 2, 1.0f);
    const runtime::HostTensor x2 = random_host({t, h}, 3, 1.0f), dy2 = random_host({t, h}, 4, 1.0f);
    const MoeGrads want = grouped_backward(x2, w, c, dy2, groups);
    const MoeRun got = run_moe_backward(mesh, c, w, {{x1, dy1}, {x2, dy2}});
    expect_gradients_match(
        got.grads, want, bound_for(t, h),
        fmt::format("k {} capacity {} renormalize {}", c.top_k, c.capacity_factor, c.renormalize));
  }
}

// Qwen2-MoE's shared expert: its SwiGLU backward on the rows each device ran it on, its gate's
// gradient through the routing weights' reduction. Fs split over tp with the experts' F (12) or
// replicated where it does not divide (9), so that its rows are shared out over ep, tp or both;
// raw top-2 weights (norm_topk_prob false) with a capacity that drops, so that the experts and
// the shared expert see different rows; 16 and 7 tokens (an uneven share of rows, and devices
// holding none).
TEST_P(ShardedMoeBackwardTest, ASharedExpertHasTheDenseReferenceGradients) {
  const runtime::DeviceMesh mesh = make_mesh(GetParam());
  const std::int64_t h = 16, f = 8, e = 4;
  for (const std::int64_t fs : {12, 9}) {
    const MoeWeights w = testing::with_shared_expert(h, f, e, fs);
    const MoeConfig c{.num_experts = e, .top_k = 2, .capacity_factor = 0.75f, .renormalize = false};
    for (const std::int64_t t : {16, 7}) {
      const std::int64_t groups = testing::expected_groups(GetParam(), {"dp", "fsdp"}, t);
      const runtime::HostTensor x1 = random_host({t, h}, 1, 1.0f),
                                dy1 = random_host({t, h}, 2, 1.0f);
      const runtime::HostTensor x2 = random_host({t, h}, 3, 1.0f),
                                dy2 = random_host({t, h}, 4, 1.0f);
      const MoeGrads want = grouped_backward(x2, w, c, dy2, groups);
      const MoeRun got = run_moe_backward(mesh, c, w, {{x1, dy1}, {x2, dy2}});
      ASSERT_FALSE(want.dshared_expert_gate.shape.empty());
      expect_gradients_match(got.grads, want, bound_for(t, h), fmt::format("Fs {} T {}", fs, t));
    }
  }
}

// Tokens split over the expert axis too (EasyDeL's expert parallelism with the data split over
// ep): GShard's all-to-all dispatch and combine, their backward the same all-to-alls the other
// way. Each split of the tokens is a routing group; dropless, with a capacity that drops (the
// slots' padding never reaches a gradient), top-1 raw, and with a shared expert.
TEST_P(ShardedMoeBackwardTest, AllToAllDispatchHasTheDenseReferenceGradients) {
  const runtime::DeviceMesh mesh = make_mesh(GetParam());
  const std::int64_t t = 16, h = 16, f = 8, e = 4;
  const MoeAxes axes{.batch = {"dp", "fsdp", "ep"}};
  const std::int64_t groups = testing::expected_groups(GetParam(), axes.batch, t);
  for (const bool with_shared : {false, true}) {
    const MoeWeights w = with_shared ? testing::with_shared_expert(h, f, e, 12)
                                     : testing::random_moe_weights(h, f, e);
    for (const MoeConfig& c :
         {MoeConfig{.num_experts = e, .top_k = 2},
          MoeConfig{.num_experts = e, .top_k = 2, .capacity_factor = 0.75f},
          MoeConfig{.num_experts = e, .top_k = 1, .capacity_factor = 1.0f, .renormalize = false}}) {
      const runtime::HostTensor x1 = random_host({t, h}, 1, 1.0f),
                                dy1 = random_host({t, h}, 2, 1.0f);
      const runtime::HostTensor x2 = random_host({t, h}, 3, 1.0f),
                                dy2 = random_host({t, h}, 4, 1.0f);
      const MoeGrads want = grouped_backward(x2, w, c, dy2, groups);
      const MoeRun got = run_moe_backward(mesh, c, w, {{x1, dy1}, {x2, dy2}}, axes);
      expect_gradients_match(got.grads, want, bound_for(t, h),
                             fmt::format("k {} capacity {} renormalize {} shared {}", c.top_k,
                                         c.capacity_factor, c.renormalize, with_shared));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, ShardedMoeBackwardTest,
    ::testing::Values(MeshCase{{1}, {"ep"}}, MeshCase{{2}, {"ep"}}, MeshCase{{4}, {"ep"}},
                      MeshCase{{2}, {"tp"}}, MeshCase{{2}, {"dp"}}, MeshCase{{2}, {"fsdp"}},
                      MeshCase{{2, 2}, {"ep", "tp"}}, MeshCase{{2, 2}, {"dp", "ep"}},
                      MeshCase{{2, 2}, {"fsdp", "ep"}}, MeshCase{{2, 2, 2}, {"dp", "ep", "tp"}}),
    mesh_case_name);

// The forward's collectives transposed: on (dp 2, ep 2) the forward's all-reduce of y over ep
// costs dy nothing; the routing weights' gradients ([rows, k]) and dx are all-reduced over
// ep, the four weights' gradients over dp.
TEST(ShardedMoeBackwardCollectivesTest, AreTheForwardsTransposedPlusTheRoutingWeights) {
  using Kind = sharding::ReshardStep::Kind;
  const runtime::DeviceMesh mesh = make_mesh(MeshCase{{2, 2}, {"dp", "ep"}});
  const runtime::HostTensor x = random_host({8, 16}, 1, 1.0f), dy = random_host({8, 16}, 2, 1.0f);
  const MoeRun run = run_moe_backward(mesh, MoeConfig{.num_experts = 4, .top_k = 2},
                                      testing::random_moe_weights(16, 8, 4), {{x, dy}});
  std::vector<std::string> over_ep, over_dp;
  for (const CollectivePlan& cp : run.collectives) {
    EXPECT_EQ(cp.step.kind, Kind::kAllReduce) << cp.name;
    (cp.step.axes == std::vector<std::string>{"ep"} ? over_ep : over_dp).push_back(cp.name);
  }
  EXPECT_THAT(over_ep, ::testing::UnorderedElementsAre(HasSubstr("moe.bwd.dweights"),
                                                       HasSubstr("moe.bwd.dx")));
  EXPECT_EQ(over_dp.size(), 4u) << "router, gate, up and down gradients over dp";
}

// The all-to-all dispatch's backward on (dp 2, ep 2) with tokens split over both: the slots'
// gradients travel to the experts and back by all-to-all over ep (the combine's and the
// dispatch's transposes); nothing is gathered; the routing weights' gradients need no
// reduction (F is not split); the experts' gradients are all-reduced over dp only (each
// expert's device saw every ep block's tokens), the router's over dp and ep.
TEST(ShardedMoeBackwardCollectivesTest, AllToAllDispatchIsTransposedByAllToAlls) {
  using Kind = sharding::ReshardStep::Kind;
  const runtime::DeviceMesh mesh = make_mesh(MeshCase{{2, 2}, {"dp", "ep"}});
  const runtime::HostTensor x = random_host({8, 16}, 1, 1.0f), dy = random_host({8, 16}, 2, 1.0f);
  const MoeRun run = run_moe_backward(mesh, MoeConfig{.num_experts = 4, .top_k = 2},
                                      testing::random_moe_weights(16, 8, 4), {{x, dy}},
                                      MoeAxes{.batch = {"dp", "ep"}});
  std::vector<std::string> all_to_all, over_dp, over_both;
  const std::vector<std::string> ep{"ep"}, dp{"dp"};
  for (const CollectivePlan& cp : run.collectives) {
    if (cp.step.kind == Kind::kAllToAll) {
      EXPECT_EQ(cp.step.axes, ep) << cp.name;
      all_to_all.push_back(cp.name);
      continue;
    }
    EXPECT_EQ(cp.step.kind, Kind::kAllReduce) << cp.name;
    if (cp.step.axes == dp) {
      over_dp.push_back(cp.name);
    } else {
      EXPECT_THAT(cp.step.axes, ::testing::UnorderedElementsAre("dp", "ep")) << cp.name;
      over_both.push_back(cp.name);
    }
  }
  EXPECT_THAT(all_to_all, ::testing::UnorderedElementsAre(HasSubstr("moe.bwd.dcombine"),
                                                          HasSubstr("moe.bwd.ddispatch")));
  EXPECT_THAT(over_dp, ::testing::UnorderedElementsAre(HasSubstr("w_gate"), HasSubstr("w_up"),
                                                       HasSubstr("w_down")));
  EXPECT_THAT(over_both, ::testing::UnorderedElementsAre(HasSubstr("router")));
}

TEST(ShardedMoeBackwardErrorsTest, RefusesWhatItCannotDifferentiate) {
  const MoeConfig c{.num_experts = 4, .top_k = 2};
  const runtime::HostTensor x = random_host({8, 16}, 1, 1.0f);
  MoeWeights bf16 = testing::random_moe_weights(16, 8, 4);
  bf16.stored_as = MlpFormats::all(DType::kBF16);
  EXPECT_THAT([&] { (void)moe_backward(x, bf16, c, x); },
              ThrowsMessage<NotImplementedError>(
                  HasSubstr("moe backward: 16-bit experts are not differentiated yet")));
  MoeWeights misshapen = testing::with_shared_expert(16, 8, 4, 12);
  misshapen.shared_expert_gate = random_host({16, 2}, 8, 0.3f);
  EXPECT_THAT(
      [&] { (void)moe_backward(x, misshapen, c, x); },
      ThrowsMessage<ShapeError>(HasSubstr("moe: shared_expert_gate is [16, 2], expected [16, 1]")));
  EXPECT_THAT(
      [&] {
        (void)moe_backward(x, testing::random_moe_weights(16, 8, 4),
                           MoeConfig{.num_experts = 4, .top_k = 5}, x);
      },
      ThrowsMessage<ValueError>(HasSubstr("top_k 5 must be between 1 and the 4 experts")));
  // A backward whose forward kept nothing.
  const runtime::DeviceMesh mesh = make_mesh(MeshCase{{1}, {"ep"}});
  const MoeLayer layer = MoeLayer::create(mesh, c, testing::random_moe_weights(16, 8, 4));
  ProgramBuilder pb(mesh, "moe");
  runtime::Frontier loaded;
  runtime::ShardedTensor& xs = pb.input("x", {8, 16}, sharding::PartitionSpec(), loaded);
  EXPECT_THAT(
      [&] {
        emit_moe_backward(pb, layer, MoeSaved{}, xs, loaded, xs, MoeGradients::like(layer),
                          "moe.bwd");
      },
      ThrowsMessage<ValueError>(HasSubstr("moe.bwd: the forward kept nothing for the backward")));
  // dy and dx of another shape than the forward's x and y.
  runtime::ShardedTensor& ys =
      pb.tensor("y", TensorRole::kOutput, {8, 16}, sharding::PartitionSpec());
  MoeSaved saved;
  const runtime::Frontier forward = emit_moe(pb, layer, xs, loaded, ys, "moe", nullptr, &saved);
  runtime::ShardedTensor& short_dy =
      pb.tensor("dy", TensorRole::kActivation, {4, 16}, sharding::PartitionSpec());
  EXPECT_THAT(
      [&] {
        emit_moe_backward(pb, layer, saved, short_dy, forward, xs, MoeGradients::like(layer),
                          "moe.bwd");
      },
      ThrowsMessage<ShapeError>(HasSubstr("moe.bwd: dy 4x16 P() and dx 8x16 P() must be laid out "
                                          "as the forward's y and x (8x16)")));
  // A shared expert without gradients for it.
  const MoeLayer with_shared = MoeLayer::create(mesh, c, testing::with_shared_expert(16, 8, 4, 12));
  MoeSaved shared_saved;
  runtime::ShardedTensor& ys2 =
      pb.tensor("y2", TensorRole::kOutput, {8, 16}, sharding::PartitionSpec());
  const runtime::Frontier shared_forward =
      emit_moe(pb, with_shared, xs, loaded, ys2, "moe2", nullptr, &shared_saved);
  EXPECT_THAT(
      [&] {
        emit_moe_backward(pb, with_shared, shared_saved, ys2, shared_forward, xs,
                          MoeGradients::like(layer), "moe2.bwd");
      },
      ThrowsMessage<ValueError>(
          HasSubstr("moe2.bwd: the layer has a shared expert but no gradients are given for it")));
}

}  // namespace
}  // namespace numesh::ops
