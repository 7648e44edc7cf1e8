// The training step of a whole language model (LmTrainingStep) against its dense oracle
// (lm_training_reference: the operators' backward references chained, each checked against
// PyTorch's autograd) on many mesh shapes, tied and untied heads; and its refusals.

#include "numesh/ops/lowering/lm_training.hpp"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "numesh/core/error.hpp"
#include "numesh/ops/compare.hpp"
#include "numesh/ops/eigen_views.hpp"
#include "numesh/ops/reference/lm_training.hpp"
#include "test_util.hpp"

namespace numesh::ops {
namespace {

using ::testing::HasSubstr;
using testing::make_mesh;
using testing::mesh_case_name;
using testing::MeshCase;
using ::testing::ThrowsMessage;

constexpr std::int64_t kVocab = 64, kBatch = 4, kTokens = 8;

using testing::tiny_lm_config;

struct TinyModel {
  TransformerConfig config = tiny_lm_config();
  EmbeddingWeights embedding{.table = testing::random_host({kVocab, 32}, 11, 1.0f)};
  TransformerWeights stack = TransformerWeights::random(tiny_lm_config(), 12);
  LmHeadWeights head{.weight = testing::random_host({32, kVocab}, 13, 0.2f)};
};

// Ids of a fixed pseudo-random sequence; targets are the inputs shifted by one.
std::vector<std::int32_t> ids(std::uint32_t seed) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(kBatch * kTokens));
  std::uint32_t s = seed;
  for (auto& id : v) {
    s = s * 1664525u + 1013904223u;
    id = static_cast<std::int32_t>((s >> 8) % kVocab);
  }
  return v;
}

// The ZeRO-3 axis splits the MLP weights whenever the mesh has it.
ModelAxes axes_for(const MeshCase& c) {
  ModelAxes axes;
  for (const std::string& name : c.names) {
    if (name == "fsdp") axes.weights = {"fsdp"};
  }
  return axes;
}

// Every parameter's gradient of `step`'s last run equals the reference's within 1e-4
// (matches_reference, which also proves the check can fail).
void expect_gradients_match(const LmTrainingStep& step, const LmTrainingGrads& want,
                            const std::string& where) {
  ASSERT_EQ(step.parameters().size(), want.grads.size()) << where;
  for (const TrainableParameter& p : step.parameters()) {
    runtime::HostTensor got = runtime::gather(*p.grad);
    if (p.layout == WeightLayout::kOutIn) got = transposed(got);
    ASSERT_TRUE(want.grads.contains(p.name)) << where << ": " << p.name;
    EXPECT_TRUE(testing::matches_reference(got, want.grads.at(p.name), 1e-4))
        << where << ": " << p.name;
  }
}

class LmTrainingStepTest : public ::testing::TestWithParam<MeshCase> {};

// The loss and every parameter's gradient equal the oracle's, untied and tied.
TEST_P(LmTrainingStepTest, LossAndGradientsEqualTheDenseReference) {
  const runtime::DeviceMesh mesh = make_mesh(GetParam());
  const TinyModel m;
  const std::vector<std::int32_t> inputs = ids(1), targets = ids(2);
  for (const bool tied : {false, true}) {
    const LmHeadWeights* head = tied ? nullptr : &m.head;
    const LmTrainingGrads want = lm_training_reference(m.config, m.embedding, m.stack, head, inputs,
                                                       targets, kBatch, kTokens);
    LmTrainingStep step(mesh, m.config, m.embedding, m.stack, head, kBatch, kTokens,
                        axes_for(GetParam()));
    const double loss = step.run(inputs, targets);
    const std::string where = tied ? "tied" : "untied";
    EXPECT_NEAR(loss, want.loss, 1e-5 * want.loss) << where;
    expect_gradients_match(step, want, where);
    // A second step on other tokens overwrites the gradients (nothing accumulates).
    const std::vector<std::int32_t> more = ids(3);
    const LmTrainingGrads again =
        lm_training_reference(m.config, m.embedding, m.stack, head, more, inputs, kBatch, kTokens);
    EXPECT_NEAR(step.run(more, inputs), again.loss, 1e-5 * again.loss) << where;
    const TrainableParameter& table = step.parameters().front();
    EXPECT_TRUE(
        testing::matches_reference(runtime::gather(*table.grad), again.grads.at(table.name), 1e-4))
        << where;
  }
}

// Qwen2's q, k, v biases (and an o bias, as Llama's attention_bias has), Qwen3's per-head q/k
// norms and Llama's mlp_bias are parameters too: the loss and every gradient, theirs included,
// equal the oracle's (whose backward autograd checks: ops_backward_matches_pytorch,
// attention_bias_norm and swiglu_bias). On tp4 the kv heads are shared by the devices of the
// heads axis; on fsdp the MLP's weights are split, its biases not.
TEST_P(LmTrainingStepTest, BiasesAndQkNormsHaveTheReferenceGradients) {
  const runtime::DeviceMesh mesh = make_mesh(GetParam());
  TinyModel m;
  std::uint32_t seed = 40;
  for (BlockWeights& b : m.stack.blocks) {
    b.attention.bq = testing::random_host({4 * 8}, seed++, 0.5f);
    b.attention.bk = testing::random_host({2 * 8}, seed++, 0.5f);
    b.attention.bv = testing::random_host({2 * 8}, seed++, 0.5f);
    b.attention.bo = testing::random_host({32}, seed++, 0.5f);
    b.attention.q_norm = testing::random_host({8}, seed++, 1.0f);
    b.attention.k_norm = testing::random_host({8}, seed++, 1.0f);
    b.mlp.gate_bias = testing::random_host({64}, seed++, 0.5f);
    b.mlp.up_bias = testing::random_host({64}, seed++, 0.5f);
    b.mlp.down_bias = testing::random_host({32}, seed++, 0.5f);
  }
  const std::vector<std::int32_t> inputs = ids(8), targets = ids(9);
  const LmTrainingGrads want = lm_training_reference(m.config, m.embedding, m.stack, &m.head,
                                                     inputs, targets, kBatch, kTokens);
  for (const char* slot :
       {"attention.bq", "attention.bk", "attention.bv", "attention.bo", "attention.q_norm",
        "attention.k_norm", "mlp.gate_bias", "mlp.up_bias", "mlp.down_bias"}) {
    ASSERT_TRUE(want.grads.contains(std::string("layers.1.") + slot)) << slot;
  }
  LmTrainingStep step(mesh, m.config, m.embedding, m.stack, &m.head, kBatch, kTokens,
                      axes_for(GetParam()));
  EXPECT_NEAR(step.run(inputs, targets), want.loss, 1e-5 * want.loss);
  expect_gradients_match(step, want, "biases and q/k norms");
}

// TransformerConfig::mlp_kind reaches the step's dense MLPs: a GELU MLP (up and down, no gate)
// trains as the oracle's mlp_backward says, and has no "mlp.gate" parameter.
TEST_P(LmTrainingStepTest, AGeluMlpHasTheReferenceGradients) {
  const runtime::DeviceMesh mesh = make_mesh(GetParam());
  TinyModel m;
  m.config.mlp_kind = MlpKind::kGelu;
  m.stack = TransformerWeights::random(m.config, 12);
  ASSERT_TRUE(m.stack.blocks[0].mlp.gate.shape.empty());
  const std::vector<std::int32_t> inputs = ids(4), targets = ids(5);
  const LmTrainingGrads want = lm_training_reference(m.config, m.embedding, m.stack, &m.head,
                                                     inputs, targets, kBatch, kTokens);
  EXPECT_FALSE(want.grads.contains("layers.0.mlp.gate"));
  LmTrainingStep step(mesh, m.config, m.embedding, m.stack, &m.head, kBatch, kTokens,
                      axes_for(GetParam()));
  EXPECT_NEAR(step.run(inputs, targets), want.loss, 1e-5 * want.loss);
  expect_gradients_match(step, want, "gelu");
  // Not the SwiGLU model's loss: the kind was not dropped on the way.
  TinyModel swiglu;
  EXPECT_GT(std::abs(lm_training_reference(swiglu.config, swiglu.embedding, swiglu.stack,
                                           &swiglu.head, inputs, targets, kBatch, kTokens)
                         .loss -
                     want.loss),
            1e-4);
}

// Gemma's parts: a GeGLU MLP, RMSNorms that scale by 1 + w (norm_weight_offset; the stored w
// is what trains, near 0) and an embedding scaled by sqrt(H), tied and untied: the loss and
// every gradient equal the oracle's, and each part changes the loss (none was dropped).
TEST_P(LmTrainingStepTest, GemmasPartsHaveTheReferenceGradients) {
  const runtime::DeviceMesh mesh = make_mesh(GetParam());
  TinyModel m;
  m.config.mlp_kind = MlpKind::kGeGLU;
  m.config.norm_weight_offset = 1.0f;
  m.stack = TransformerWeights::random(m.config, 12);
  std::uint32_t seed = 70;
  const auto near_zero = [&](runtime::HostTensor& w) {
    w = testing::random_host(w.shape, seed++, 0.1f);
  };
  for (BlockWeights& b : m.stack.blocks) {
    near_zero(b.attn_norm);
    near_zero(b.ffn_norm);
  }
  near_zero(m.stack.final_norm);
  m.embedding.output_scale = std::sqrt(32.0f);
  const std::vector<std::int32_t> inputs = ids(6), targets = ids(7);
  for (const bool tied : {false, true}) {
    const LmHeadWeights* head = tied ? nullptr : &m.head;
    const std::string where = tied ? "gemma, tied" : "gemma";
    const LmTrainingGrads want = lm_training_reference(m.config, m.embedding, m.stack, head, inputs,
                                                       targets, kBatch, kTokens);
    LmTrainingStep step(mesh, m.config, m.embedding, m.stack, head, kBatch, kTokens,
                        axes_for(GetParam()));
    EXPECT_NEAR(step.run(inputs, targets), want.loss, 1e-5 * want.loss) << where;
    expect_gradients_match(step, want, where);
    TinyModel other = m;
    other.config.mlp_kind = MlpKind::kSwiGLU;
    TinyModel no_offset = m;
    no_offset.config.norm_weight_offset = 0.0f;
    TinyModel unscaled = m;
    unscaled.embedding.output_scale = 1.0f;
    for (const TinyModel* changed : {&other, &no_offset, &unscaled}) {
      EXPECT_GT(std::abs(lm_training_reference(changed->config, changed->embedding, changed->stack,
                                               head, inputs, targets, kBatch, kTokens)
                             .loss -
                         want.loss),
                1e-4)
          << where;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, LmTrainingStepTest,
    ::testing::Values(MeshCase{{1}, {"tp"}}, MeshCase{{2}, {"tp"}}, MeshCase{{4}, {"tp"}},
                      MeshCase{{2}, {"dp"}}, MeshCase{{2}, {"fsdp"}}, MeshCase{{2}, {"sp"}},
                      MeshCase{{2, 2}, {"dp", "tp"}}, MeshCase{{2, 2}, {"fsdp", "tp"}},
                      MeshCase{{2, 2}, {"sp", "tp"}}, MeshCase{{2, 2}, {"dp", "sp"}},
                      MeshCase{{2, 2, 2}, {"dp", "sp", "tp"}},
                      MeshCase{{2, 2, 2}, {"dp", "fsdp", "tp"}}),
    mesh_case_name);

// bf16 compute (MatmulPrecision::kBF16): every product of activations and weights rounds both to
// bf16, so the step is the oracle's within bf16's precision (unit roundoff 2^-9 = 2e-3 per
// operand), not fp32's. Measured on these meshes (the same on all five: each element's vdpbf16ps
// chain does not depend on the tiling): the loss within 4.4e-4 relative, the gradients within
// 1.5e-2 of their scale (ops::compare; the dense MLP's gate the farthest, the router 1.1e-2). The
// bound must also be one that the fp32 step passes by far, and the bf16 step must differ from the
// fp32 one by more than fp32 rounding does: a step that ignored the precision would pass the bound
// unseen.
class LmTrainingStepBf16Test : public ::testing::TestWithParam<MeshCase> {};

TEST_P(LmTrainingStepBf16Test, LossAndGradientsEqualTheDenseReferenceWithinBf16) {
  const runtime::DeviceMesh mesh = make_mesh(GetParam());
  const TinyModel m;
  const TransformerConfig moe = testing::tiny_moe_lm_config();
  const TransformerWeights moe_stack = TransformerWeights::random(moe, 14);
  const std::vector<std::int32_t> inputs = ids(6), targets = ids(7);
  for (const bool with_moe : {false, true}) {
    const TransformerConfig& c = with_moe ? moe : m.config;
    const TransformerWeights& stack = with_moe ? moe_stack : m.stack;
    const std::string where = with_moe ? "moe" : "dense";
    const LmTrainingGrads want =
        lm_training_reference(c, m.embedding, stack, &m.head, inputs, targets, kBatch, kTokens);
    LmTrainingStep bf16(mesh, c, m.embedding, stack, &m.head, kBatch, kTokens, axes_for(GetParam()),
                        MatmulPrecision::kBF16);
    LmTrainingStep fp32(mesh, c, m.embedding, stack, &m.head, kBatch, kTokens,
                        axes_for(GetParam()));
    EXPECT_EQ(bf16.precision(), MatmulPrecision::kBF16);
    const double loss = bf16.run(inputs, targets);
    fp32.run(inputs, targets);
    EXPECT_NEAR(loss, want.loss, 2e-3 * want.loss) << where;
    double largest_difference = 0.0;
    for (std::size_t i = 0; i < bf16.parameters().size(); ++i) {
      const TrainableParameter& p = bf16.parameters()[i];
      runtime::HostTensor got = runtime::gather(*p.grad),
                          exact = runtime::gather(*fp32.parameters()[i].grad);
      if (p.layout == WeightLayout::kOutIn) {
        got = transposed(got);
        exact = transposed(exact);
      }
      const runtime::HostTensor& ref = want.grads.at(p.name);
      const Comparison c_bf16 =
          compare(std::span<const float>(got.data), std::span<const float>(ref.data), ref.shape);
      EXPECT_TRUE(c_bf16.is_finite_reference() && c_bf16.within(3e-2))
          << where << ": " << p.name << ": " << c_bf16.describe();
      const Comparison c_fp32 =
          compare(std::span<const float>(exact.data), std::span<const float>(ref.data), ref.shape);
      EXPECT_TRUE(c_fp32.within(1e-4))
          << where << ": " << p.name << " (f32): " << c_fp32.describe();
      largest_difference = std::max(largest_difference, c_bf16.relative_error);
    }
    EXPECT_GT(largest_difference, 1e-3)
        << where << ": bf16 compute gave fp32's gradients: nothing was rounded";
  }
}

INSTANTIATE_TEST_SUITE_P(Meshes, LmTrainingStepBf16Test,
                         ::testing::Values(MeshCase{{1}, {"tp"}}, MeshCase{{2}, {"tp"}},
                                           MeshCase{{2}, {"fsdp"}}, MeshCase{{2, 2}, {"dp", "ep"}},
                                           MeshCase{{2, 2}, {"sp", "tp"}}),
                         mesh_case_name);

// A model whose second block is a mixture of experts (Mixtral's top-2 of 4, renormalised,
// dropless): the loss and every gradient equal the oracle's on meshes over ep and its products
// with dp, fsdp, sp and tp. Dropless, so the step's routing groups (each device's tokens) give
// what the oracle's one group gives.
class LmTrainingStepMoeTest : public ::testing::TestWithParam<MeshCase> {};

// With the router's load-balancing loss too (transformers' output_router_logits, coefficient
// 0.05 here against Mixtral's default 0.001, so that it moves the routers' gradients by far
// more than the bound), whose reference autograd checks (ops_backward_matches_pytorch, moe_aux).
TEST_P(LmTrainingStepMoeTest, LossAndGradientsEqualTheDenseReference) {
  const runtime::DeviceMesh mesh = make_mesh(GetParam());
  const TransformerConfig c = testing::tiny_moe_lm_config();
  const TransformerWeights stack = TransformerWeights::random(c, 14);
  const TinyModel m;
  const std::vector<std::int32_t> inputs = ids(4), targets = ids(5);
  const LmTrainingGrads plain =
      lm_training_reference(c, m.embedding, stack, &m.head, inputs, targets, kBatch, kTokens);
  constexpr double kCoef = 0.05;
  const LmTrainingGrads with_aux = lm_training_reference(c, m.embedding, stack, &m.head, inputs,
                                                         targets, kBatch, kTokens, kCoef);
  EXPECT_TRUE(plain.grads.contains("layers.1.moe.router"));
  ASSERT_GT(with_aux.router_aux_loss, 0.5) << "E sum f p is about k = 2 for a balanced router";
  EXPECT_NEAR(with_aux.loss, plain.loss + kCoef * with_aux.router_aux_loss, 1e-12);
  const Comparison moved =
      compare(std::span<const float>(plain.grads.at("layers.1.moe.router").data),
              std::span<const float>(with_aux.grads.at("layers.1.moe.router").data),
              with_aux.grads.at("layers.1.moe.router").shape);
  ASSERT_FALSE(moved.within(1e-2))
      << "the aux term must move the router's gradient: " << moved.describe();
  for (const double coef : {0.0, kCoef}) {
    const LmTrainingGrads& want = coef > 0.0 ? with_aux : plain;
    const std::string where = coef > 0.0 ? "with the router's aux loss" : "moe";
    LmTrainingStep step(mesh, c, m.embedding, stack, &m.head, kBatch, kTokens, axes_for(GetParam()),
                        MatmulPrecision::kF32, coef);
    EXPECT_NEAR(step.run(inputs, targets), want.loss, 1e-5 * want.loss) << where;
    EXPECT_NEAR(step.router_aux_loss(), want.router_aux_loss, 1e-5 * want.router_aux_loss) << where;
    expect_gradients_match(step, want, where);
  }
  EXPECT_THAT(
      [&] {
        LmTrainingStep(mesh, c, m.embedding, stack, &m.head, kBatch, kTokens, {},
                       MatmulPrecision::kF32, -1.0);
      },
      ThrowsMessage<ValueError>(
          HasSubstr("the router's aux loss coefficient -1 must be finite and not negative")));
}

// Tokens split over the expert axis as well as the batch axes: the MoE block's tokens go to
// their experts and back by all-to-all (and its backward by the same all-to-alls reversed).
// Dropless, so each device's routing group gives the oracle's routing; with and without the
// router's load-balancing loss.
TEST_P(LmTrainingStepMoeTest, TokensSplitOverTheExpertAxisTravelByAllToAll) {
  const runtime::DeviceMesh mesh = make_mesh(GetParam());
  const TransformerConfig c = testing::tiny_moe_lm_config();
  const TransformerWeights stack = TransformerWeights::random(c, 14);
  const TinyModel m;
  const std::vector<std::int32_t> inputs = ids(4), targets = ids(5);
  ModelAxes axes = axes_for(GetParam());
  axes.batch = {"dp", "fsdp", "ep"};
  for (const double coef : {0.0, 0.05}) {
    const LmTrainingGrads want = lm_training_reference(c, m.embedding, stack, &m.head, inputs,
                                                       targets, kBatch, kTokens, coef);
    LmTrainingStep step(mesh, c, m.embedding, stack, &m.head, kBatch, kTokens, axes,
                        MatmulPrecision::kF32, coef);
    step.run(ids(6), ids(7));  // other tokens first: nothing of that run may linger
    EXPECT_NEAR(step.run(inputs, targets), want.loss, 1e-5 * want.loss) << "coef " << coef;
    expect_gradients_match(step, want, fmt::format("all-to-all, coef {}", coef));
  }
}

// Qwen2-MoE's block: raw top-2 weights (norm_topk_prob false) and a shared expert of 24 behind
// its sigmoid gate, its matrices and gate trained as parameters of their own.
TEST_P(LmTrainingStepMoeTest, ASharedExpertHasTheReferenceGradients) {
  const runtime::DeviceMesh mesh = make_mesh(GetParam());
  TransformerConfig c = testing::tiny_moe_lm_config();
  c.moe.renormalize = false;
  c.shared_expert_ffn = 24;
  const TransformerWeights stack = TransformerWeights::random(c, 15);
  const TinyModel m;
  const std::vector<std::int32_t> inputs = ids(4), targets = ids(5);
  const LmTrainingGrads want =
      lm_training_reference(c, m.embedding, stack, &m.head, inputs, targets, kBatch, kTokens);
  for (const char* slot :
       {"shared_expert.gate", "shared_expert.up", "shared_expert.down", "shared_expert_gate"}) {
    ASSERT_TRUE(want.grads.contains(std::string("layers.1.moe.") + slot)) << slot;
  }
  LmTrainingStep step(mesh, c, m.embedding, stack, &m.head, kBatch, kTokens, axes_for(GetParam()));
  step.run(ids(6), ids(7));  // other tokens first: nothing of that run may linger
  EXPECT_NEAR(step.run(inputs, targets), want.loss, 1e-5 * want.loss);
  expect_gradients_match(step, want, "shared expert");
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, LmTrainingStepMoeTest,
    ::testing::Values(MeshCase{{1}, {"ep"}}, MeshCase{{2}, {"ep"}}, MeshCase{{4}, {"ep"}},
                      MeshCase{{2}, {"tp"}}, MeshCase{{2}, {"dp"}}, MeshCase{{2, 2}, {"dp", "ep"}},
                      MeshCase{{2, 2}, {"ep", "tp"}}, MeshCase{{2, 2}, {"sp", "ep"}},
                      MeshCase{{2, 2}, {"fsdp", "ep"}}, MeshCase{{2, 2, 2}, {"dp", "ep", "tp"}}),
    mesh_case_name);

// The gradients' reductions overlap the rest of the backward: on dp2 every parameter gradient
// is all-reduced over dp, and no node of block 0's backward (which runs after block 1's) waits
// for block 1's weight-gradient collectives, only for block 1's dx.
TEST(LmTrainingStepOverlapTest, GradientCollectivesDoNotHoldUpTheRestOfTheBackward) {
  const TinyModel m;
  LmTrainingStep step(make_mesh(MeshCase{{2}, {"dp"}}), m.config, m.embedding, m.stack, &m.head,
                      kBatch, kTokens);
  const runtime::CompiledGraph& graph = step.program().graph();
  std::vector<runtime::NodeId> reductions, block0;
  const auto nodes = static_cast<runtime::NodeId>(graph.size());
  for (runtime::NodeId id = 0; id < nodes; ++id) {
    const std::string& name = graph.node(id).name;
    if (name.starts_with("block1.") && name.find(".grad") != std::string::npos &&
        graph.node(id).kind == runtime::NodeKind::kCollective) {
      reductions.push_back(id);
    }
    if (name.starts_with("block0.") && name.find(".bwd") != std::string::npos) block0.push_back(id);
  }
  ASSERT_GE(reductions.size(), 7u)
      << "block 1's wq, wk, wv, wo, gate, up, down and norms all-reduced over dp";
  ASSERT_FALSE(block0.empty());
  // Every node block 0's backward nodes wait for, directly or not (ids only grow along edges).
  std::vector<bool> waited(graph.size(), false);
  for (const runtime::NodeId id : block0) waited[id] = true;
  for (runtime::NodeId id = nodes; id-- > 0;) {
    if (!waited[id]) continue;
    for (const runtime::NodeId dep : graph.node(id).deps) waited[dep] = true;
  }
  for (const runtime::NodeId id : reductions) {
    EXPECT_FALSE(waited[id]) << graph.node(id).name << " holds up block 0's backward";
  }
}

// A parameter's gradient with nothing to reduce is written in place by the node that computes
// it: on one device (its axes of size 1 included) no node moves the matrices' gradients; on
// dp2 each is all-reduced. (The loss and gradients are checked on both by the tests above.)
TEST(LmTrainingStepOverlapTest, GradientsWithNothingToReduceAreWrittenInPlace) {
  const TinyModel m;
  const auto moving = [&](const MeshCase& mesh) {
    LmTrainingStep step(make_mesh(mesh), m.config, m.embedding, m.stack, &m.head, kBatch, kTokens);
    const runtime::CompiledGraph& graph = step.program().graph();
    std::vector<std::string> names;
    for (runtime::NodeId id = 0; id < static_cast<runtime::NodeId>(graph.size()); ++id) {
      const std::string& name = graph.node(id).name;
      for (const char* weight : {".w_up.grad", ".w_gate.grad", ".w_down.grad", ".wq.grad",
                                 ".wo.grad", "lm_head.bwd.weight.grad", "embedding.bwd.grad"}) {
        if (name.find(weight) != std::string::npos) names.push_back(name);
      }
    }
    return names;
  };
  EXPECT_THAT(moving(MeshCase{{1, 1, 1}, {"dp", "ep", "tp"}}), ::testing::IsEmpty());
  EXPECT_THAT(moving(MeshCase{{1}, {"tp"}}), ::testing::IsEmpty());
  EXPECT_GE(moving(MeshCase{{2}, {"dp"}}).size(), 2u * 7u)
      << "two devices' parts of each all-reduce";
}

TEST(LmTrainingStepErrorTest, RefusesWhatItCannotTrainBeforeWork) {
  const TinyModel m;
  const runtime::DeviceMesh dp2 = make_mesh(MeshCase{{2}, {"dp"}});
  EXPECT_THAT([&] { LmTrainingStep(dp2, m.config, m.embedding, m.stack, &m.head, 3, kTokens); },
              ThrowsMessage<ShapeError>(HasSubstr("a batch of 3 sequences does not split over the "
                                                  "data-parallel axes (dp, fsdp) of size 2")));
  const runtime::DeviceMesh sp2 = make_mesh(MeshCase{{2}, {"sp"}});
  EXPECT_THAT([&] { LmTrainingStep(sp2, m.config, m.embedding, m.stack, &m.head, kBatch, 7); },
              ThrowsMessage<ShapeError>(HasSubstr(
                  "7 tokens per sequence do not split over the sequence axis sp of size 2")));
  const runtime::DeviceMesh one = make_mesh(MeshCase{{1}, {"tp"}});
  TransformerConfig moe = m.config;
  moe.moe = MoeConfig{.num_experts = 4, .top_k = 2};
  moe.moe_ffn = 16;
  moe.moe_every = 2;
  moe.shared_expert_ffn = 16;
  TransformerWeights bf16_shared = TransformerWeights::random(moe, 3);
  bf16_shared.blocks[1].moe.shared_expert.stored_as = MlpFormats::all(DType::kBF16);
  EXPECT_THAT([&] { LmTrainingStep(one, moe, m.embedding, bf16_shared, &m.head, kBatch, kTokens); },
              ThrowsMessage<ValueError>(HasSubstr("block 1's shared expert is stored as bf16")));
  moe.shared_expert_ffn = 0;
  EmbeddingWeights bf16 = m.embedding;
  bf16.stored_as = DType::kBF16;
  EXPECT_THAT([&] { LmTrainingStep(one, m.config, bf16, m.stack, &m.head, kBatch, kTokens); },
              ThrowsMessage<ValueError>(HasSubstr(
                  "the embedding is stored as bf16; training keeps fp32 master weights")));

  LmTrainingStep step(one, m.config, m.embedding, m.stack, &m.head, kBatch, kTokens);
  std::vector<std::int32_t> bad = ids(1);
  bad[static_cast<std::size_t>(kTokens + 3)] = static_cast<std::int32_t>(kVocab);
  EXPECT_THAT([&] { step.run(bad, ids(2)); },
              ThrowsMessage<IndexError>(HasSubstr(
                  "input id 64 of sequence 1 at position 3 is outside the vocabulary [0, 64)")));
  bad[static_cast<std::size_t>(kTokens + 3)] = -1;
  EXPECT_THAT([&] { step.run(ids(2), bad); },
              ThrowsMessage<IndexError>(HasSubstr("target id -1 of sequence 1 at position 3")));
  EXPECT_THAT(
      [&] { step.run(std::vector<std::int32_t>(5, 0), ids(2)); },
      ThrowsMessage<ShapeError>(HasSubstr("5 inputs and 32 targets for 4 sequences of 8 tokens")));
}

}  // namespace
}  // namespace numesh::ops
