#include "numesh/ops/lowering/moe.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <span>
#include <string>

#include "numesh/core/error.hpp"
#include "numesh/ops/reference/moe.hpp"
#include "test_util.hpp"

namespace numesh::ops {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

using testing::devices;
using testing::expected_groups;
using testing::make_mesh;
using testing::matches_reference;
using testing::mesh_case_name;
using testing::MeshCase;
using testing::random_host;

// The dense reference applied to each routing group (consecutive blocks of rows), with the
// statistics summed over the groups.
runtime::HostTensor grouped_reference(const runtime::HostTensor& x, const MoeWeights& w,
                                      const MoeConfig& c, std::int64_t groups, MoeStats& stats) {
  const std::int64_t t = x.shape[0], h = x.shape[1], per = t / groups;
  runtime::HostTensor y = runtime::HostTensor::zeros(x.shape);
  stats = MoeStats{.tokens_per_expert =
                       std::vector<std::int64_t>(static_cast<std::size_t>(c.num_experts), 0)};
  for (std::int64_t g = 0; g < groups; ++g) {
    const RowMatrix xg = Eigen::Map<const RowMatrix>(x.data.data() + g * per * h, per, h);
    MoeStats sg;
    const RowMatrix yg = moe_reference(xg, w, c, &sg);
    std::copy(yg.data(), yg.data() + yg.size(), y.data.begin() + g * per * h);
    for (std::size_t e = 0; e < sg.tokens_per_expert.size(); ++e)
      stats.tokens_per_expert[e] += sg.tokens_per_expert[e];
    stats.dropped += sg.dropped;
    stats.capacity = sg.capacity;
  }
  return y;
}

class ShardedMoeTest : public ::testing::TestWithParam<MeshCase> {};

TEST_P(ShardedMoeTest, EqualsTheReferencePerRoutingGroupWithItsStatistics) {
  const auto mesh = make_mesh(GetParam());
  const std::int64_t h = 16, f = 8;
  struct Case {
    std::int64_t experts, k;
    float capacity;
    bool renormalize;
  };
  for (const Case& cs : {Case{8, 2, 0.0f, true}, Case{8, 1, 1.0f, true}, Case{8, 3, 0.0f, false},
                         Case{8, 2, 0.5f, true}, Case{6, 2, 1.25f, true}}) {
    for (std::int64_t tokens : {12, 7}) {  // 7 tokens do not split over dp = 2: one group
      MoeConfig c{.num_experts = cs.experts,
                  .top_k = cs.k,
                  .capacity_factor = cs.capacity,
                  .renormalize = cs.renormalize};
      const MoeWeights w = testing::random_moe_weights(h, f, cs.experts);
      const runtime::HostTensor x = random_host({tokens, h}, 25, 1.0f);
      ShardedMoe moe(mesh, c, w, tokens);
      const runtime::HostTensor y = moe.forward(x);
      MoeStats want_stats;
      // Each device routes the tokens of its split over the batch axes (dp, fsdp).
      const std::int64_t groups = expected_groups(GetParam(), {"dp", "fsdp"}, tokens);
      const runtime::HostTensor want = grouped_reference(x, w, c, groups, want_stats);
      EXPECT_EQ(moe.groups(), groups);
      // Expert outputs are summed in another order (per device, then the all-reduce): fp32
      // bound max(1e-5, 2 * F * epsilon) relative.
      EXPECT_TRUE(matches_reference(
          y, want, std::max(1e-5, 2.0 * f * std::numeric_limits<float>::epsilon())))
          << "E " << cs.experts << " k " << cs.k << " capacity " << cs.capacity << " tokens "
          << tokens << " local experts " << moe.layer().local_experts;
      const MoeStats got = moe.stats();
      EXPECT_EQ(got.tokens_per_expert, want_stats.tokens_per_expert);
      EXPECT_EQ(got.dropped, want_stats.dropped);
      EXPECT_EQ(got.capacity, want_stats.capacity);
      EXPECT_EQ(moe.forward(x), y) << "runs again with the same result";
    }
  }
}

// Qwen2-MoE's shared expert: every token through it, scaled by sigmoid(x g), added into the
// experts' partial output before their one reduction; Fs split over tp with the experts' F (12)
// or replicated where it does not divide (9), rows shared out along the other partial axes.
// Tokens replicated over ep (all-gather path) and split over it (all-to-all path), Qwen2-MoE's
// raw top-k weights (norm_topk_prob false) and renormalised ones.
TEST_P(ShardedMoeTest, ASharedExpertEqualsTheReference) {
  const auto mesh = make_mesh(GetParam());
  const std::int64_t h = 16, f = 8, e = 8;
  for (std::int64_t fs : {12, 9}) {
    const MoeWeights w = testing::with_shared_expert(h, f, e, fs);
    for (bool renormalize : {false, true}) {
      const MoeConfig c{
          .num_experts = e, .top_k = 2, .capacity_factor = 0.0f, .renormalize = renormalize};
      for (std::int64_t tokens : {12, 7}) {
        const runtime::HostTensor x = random_host({tokens, h}, 31, 1.0f);
        for (const MoeAxes& axes : {MoeAxes{}, MoeAxes{.batch = {"dp", "ep"}}}) {
          ShardedMoe moe(mesh, c, w, tokens, axes);
          const runtime::HostTensor y = moe.forward(x);
          MoeStats want_stats;
          const std::int64_t groups = expected_groups(GetParam(), axes.batch, tokens);
          const runtime::HostTensor want = grouped_reference(x, w, c, groups, want_stats);
          const double bound =
              std::max(1e-5, 2.0 * static_cast<double>(fs) * std::numeric_limits<float>::epsilon());
          EXPECT_TRUE(matches_reference(y, want, bound))
              << "Fs " << fs << " renormalize " << renormalize << " tokens " << tokens
              << " token axes " << axes.batch.back() << ", shared expert "
              << moe.layer().shared_expert->up->spec().repr();
          EXPECT_EQ(moe.stats().tokens_per_expert, want_stats.tokens_per_expert);
          EXPECT_EQ(moe.forward(x), y) << "runs again with the same result";
        }
      }
    }
  }
  // Without its shared expert the layer is another one: the check sees it.
  MoeWeights plain = testing::with_shared_expert(h, f, e, 12);
  const runtime::HostTensor x = random_host({12, h}, 31, 1.0f);
  MoeStats unused;
  const runtime::HostTensor with =
      grouped_reference(x, plain, MoeConfig{.num_experts = e, .top_k = 2}, 1, unused);
  plain.shared_expert = {};
  plain.shared_expert_gate = {};
  const runtime::HostTensor without =
      grouped_reference(x, plain, MoeConfig{.num_experts = e, .top_k = 2}, 1, unused);
  EXPECT_FALSE(numesh::testing::within_abs(std::span<const float>(without.data),
                                           std::span<const float>(with.data), 1e-3));
}

INSTANTIATE_TEST_SUITE_P(Meshes, ShardedMoeTest,
                         ::testing::Values(MeshCase{{1}, {"ep"}}, MeshCase{{2}, {"ep"}},
                                           MeshCase{{4}, {"ep"}}, MeshCase{{8}, {"ep"}},
                                           MeshCase{{2}, {"tp"}}, MeshCase{{2, 2}, {"ep", "tp"}},
                                           MeshCase{{2, 2}, {"dp", "ep"}},
                                           MeshCase{{2, 2, 2}, {"dp", "ep", "tp"}}),
                         mesh_case_name);

TEST(ShardedMoeTest, ExpertsSplitOverEpAndTheCombineIsOneAllReduce) {
  const auto mesh = runtime::DeviceMesh::create(devices(4), {2, 2}, {"ep", "tp"});
  ShardedMoe moe(mesh, MoeConfig{.num_experts = 8, .top_k = 2},
                 testing::random_moe_weights(16, 8, 8), 4);
  EXPECT_EQ(moe.layer().local_experts, 4);
  EXPECT_EQ(moe.layer().local_ffn, 4);
  const auto& collectives = moe.program().plan().collectives;
  ASSERT_EQ(collectives.size(), 1u);
  EXPECT_EQ(collectives[0].step.kind, sharding::ReshardStep::Kind::kAllReduce);
  EXPECT_EQ(collectives[0].step.axes, (std::vector<std::string>{"ep", "tp"}));
  EXPECT_EQ(collectives[0].group_size, 4);
}

// Tokens split over ep: GShard's dispatch. Each device routes its own tokens (its routing
// group), one all-to-all over ep sends every expert's slots to the device holding it (with
// the slot counts), a second brings the outputs back; with F over tp the rows are then
// all-reduced over tp. Dropless and with capacity (drops).
TEST(ShardedMoeTest, TokensSplitOverEpTravelByAllToAll) {
  for (const MeshCase& mc :
       {MeshCase{{2}, {"ep"}}, MeshCase{{4}, {"ep"}}, MeshCase{{2, 2}, {"ep", "tp"}},
        MeshCase{{2, 2}, {"dp", "ep"}}, MeshCase{{2, 2, 2}, {"dp", "ep", "tp"}}}) {
    for (float capacity : {0.0f, 1.0f}) {
      const auto mesh = make_mesh(mc);
      const MoeConfig c{.num_experts = 8, .top_k = 2, .capacity_factor = capacity};
      const MoeWeights w = testing::random_moe_weights(16, 8, 8);
      const runtime::HostTensor x = random_host({32, 16}, 26, 1.0f);
      ShardedMoe moe(mesh, c, w, 32, MoeAxes{.batch = {"dp", "ep"}});
      const runtime::HostTensor y = moe.forward(x);
      MoeStats want_stats;
      // Every device routes its own tokens: one group per split over (dp, ep).
      const std::int64_t groups = expected_groups(mc, {"dp", "ep"}, 32);
      const runtime::HostTensor want = grouped_reference(x, w, c, groups, want_stats);
      const std::string label =
          testing::mesh_label(mc) + (capacity > 0 ? " capacity 1" : " dropless");
      EXPECT_TRUE(matches_reference(
          y, want, std::max(1e-5, 2.0 * 8 * std::numeric_limits<float>::epsilon())))
          << label;
      EXPECT_EQ(moe.stats().tokens_per_expert, want_stats.tokens_per_expert) << label;
      EXPECT_EQ(moe.stats().dropped, want_stats.dropped) << label;
      EXPECT_EQ(moe.groups(), groups) << label << ": every device routes its own tokens";
      using Kind = sharding::ReshardStep::Kind;
      std::vector<Kind> kinds;
      for (const CollectivePlan& p : moe.program().plan().collectives) kinds.push_back(p.step.kind);
      EXPECT_EQ(std::count(kinds.begin(), kinds.end(), Kind::kAllToAll), 3)
          << label << ": slots, counts, outputs";
      EXPECT_EQ(std::count(kinds.begin(), kinds.end(), Kind::kAllReduce),
                mesh.mesh().has_axis("tp") ? 1 : 0)
          << label;
      EXPECT_EQ(moe.forward(x), y) << label << ": runs again with the same result";
    }
  }
}

// The shared expert joins the experts' partial sum: still one all-reduce over ep x tp, its Fs
// split over tp as the experts' F is.
TEST(ShardedMoeTest, ASharedExpertAddsNoCollective) {
  const auto mesh = runtime::DeviceMesh::create(devices(4), {2, 2}, {"ep", "tp"});
  ShardedMoe moe(mesh, MoeConfig{.num_experts = 8, .top_k = 2},
                 testing::with_shared_expert(16, 8, 8, 12), 4);
  ASSERT_TRUE(moe.layer().shared_expert.has_value());
  // Stored out-in: up [Fs, H], down [H, Fs].
  EXPECT_EQ(moe.layer().shared_expert->up->spec().repr(), "P('tp', None)");
  EXPECT_EQ(moe.layer().shared_expert->down->spec().repr(), "P(None, 'tp')");
  const auto& collectives = moe.program().plan().collectives;
  ASSERT_EQ(collectives.size(), 1u);
  EXPECT_EQ(collectives[0].step.kind, sharding::ReshardStep::Kind::kAllReduce);
  EXPECT_EQ(collectives[0].step.axes, (std::vector<std::string>{"ep", "tp"}));
  EXPECT_THAT(moe.program().plan().text(), HasSubstr("moe.shared_w_up"));
  // Experts' F not split (tp absent): the shared expert is replicated too.
  const auto ep_only = runtime::DeviceMesh::create(devices(2), {2}, {"ep"});
  ShardedMoe replicated(ep_only, MoeConfig{.num_experts = 8, .top_k = 2},
                        testing::with_shared_expert(16, 8, 8, 12), 4);
  EXPECT_EQ(replicated.layer().shared_expert->up->spec().repr(), "P()");
}

TEST(ShardedMoeTest, BadInputIsRejectedNamingIt) {
  const auto mesh = runtime::DeviceMesh::create(devices(2), {2}, {"ep"});
  EXPECT_THAT(
      [&] {
        ShardedMoe(mesh, MoeConfig{.num_experts = 4, .top_k = 5},
                   testing::random_moe_weights(16, 8, 4), 4);
      },
      ThrowsMessage<ValueError>(HasSubstr("top_k 5 must be between 1 and the 4 experts")));
  EXPECT_THAT(
      [&] {
        ShardedMoe(mesh, MoeConfig{.num_experts = 8, .top_k = 2},
                   testing::random_moe_weights(16, 8, 4), 4);
      },
      ThrowsMessage<ShapeError>(HasSubstr("router is [16, 4], expected [H, 8] for 8 experts")));
  MoeWeights w = testing::random_moe_weights(16, 8, 4);
  w.down = random_host({4, 16, 8}, 1, 1.0f);
  EXPECT_THAT(
      [&] { ShardedMoe(mesh, MoeConfig{.num_experts = 4, .top_k = 2}, w, 4); },
      ThrowsMessage<ShapeError>(HasSubstr("down [4, 16, 8] do not fit 4 experts and hidden 16")));
  // A misshapen shared expert, refused by the layer and the reference alike.
  const MoeConfig c{.num_experts = 4, .top_k = 2};
  const RowMatrix x = RowMatrix::Zero(4, 16);
  const auto refused = [&](const MoeWeights& bad, const std::string& message) {
    EXPECT_THAT([&] { ShardedMoe(mesh, c, bad, 4); }, ThrowsMessage<ShapeError>(message));
    EXPECT_THAT([&] { (void)moe_reference(x, bad, c); }, ThrowsMessage<ShapeError>(message));
  };
  w = testing::with_shared_expert(16, 8, 4, 12);
  w.shared_expert.down = random_host({16, 12}, 1, 1.0f);
  refused(w,
          "moe: shared expert gate [16, 12], up [16, 12], down [16, 12] do not fit hidden 16 "
          "(expected [H, Fs], "
          "[H, Fs], [Fs, H])");
  w = testing::with_shared_expert(16, 8, 4, 12);
  w.shared_expert_gate = random_host({1, 16}, 1, 1.0f);
  refused(w, "moe: shared_expert_gate is [1, 16], expected [16, 1]");
  w = testing::with_shared_expert(16, 8, 4, 12);
  w.shared_expert.up = {};
  refused(w,
          "moe: shared expert gate [16, 12], down [12, 16] and shared_expert_gate [16, 1] given "
          "without its up "
          "projection");
  w = testing::with_shared_expert(16, 8, 4, 12);
  w.shared_expert.up_bias = random_host({12}, 1, 1.0f);
  refused(w,
          "moe: the shared expert has biases (gate [], up [12], down []); numesh runs it without");
  ShardedMoe moe(mesh, MoeConfig{.num_experts = 4, .top_k = 2},
                 testing::random_moe_weights(16, 8, 4), 4);
  EXPECT_THAT(
      [&] {
        moe.forward(random_host({5, 16}, 1, 1.0f));
      },
      ThrowsMessage<ShapeError>(
          HasSubstr("input is [5, 16] but the layer was compiled for [4, 16]")));
}

}  // namespace
}  // namespace numesh::ops
