// Faults put in every node of whole programs (CompiledGraph::inject_fault): a training step
// (embedding, attention, the MLP and a mixture of experts, the LM head and its cross-entropy,
// every backward and every gradient collective) and a transformer's prefill and decode. Each
// run with a fault ends with that one InjectedFault, and the same program then runs again to
// exactly the results of a run that never failed.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "numesh/core/error.hpp"
#include "numesh/ops/lowering/lm_training.hpp"
#include "numesh/ops/lowering/transformer.hpp"
#include "test_util.hpp"

namespace numesh::ops {
namespace {

using testing::make_mesh;
using testing::MeshCase;
using ::testing::StartsWith;
using ::testing::ThrowsMessage;

// Every parameter's gradient, gathered to the host.
std::map<std::string, std::vector<float>> gradients(const LmTrainingStep& step) {
  std::map<std::string, std::vector<float>> out;
  for (const TrainableParameter& p : step.parameters()) out[p.name] = runtime::gather(*p.grad).data;
  return out;
}

TEST(OperatorFaultTest, AFaultInAnyNodeOfATrainingStepEndsItOnceAndTheStepRunsAgain) {
  constexpr std::int64_t kStepVocab = 64, kStepBatch = 4, kStepTokens = 8;
  const runtime::DeviceMesh mesh = make_mesh(MeshCase{{2, 2}, {"dp", "tp"}});
  const TransformerConfig c = testing::tiny_moe_lm_config();
  const EmbeddingWeights embedding{.table = testing::random_host({kStepVocab, c.hidden}, 11, 1.0f)};
  const LmHeadWeights head{.weight = testing::random_host({c.hidden, kStepVocab}, 13, 0.2f)};
  LmTrainingStep step(mesh, c, embedding, TransformerWeights::random(c, 12), &head, kStepBatch,
                      kStepTokens);
  std::vector<std::int32_t> inputs(static_cast<std::size_t>(kStepBatch * kStepTokens)),
      targets(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    inputs[i] = static_cast<std::int32_t>((i * 7 + 3) % kStepVocab);
    targets[i] = static_cast<std::int32_t>((i * 5 + 1) % kStepVocab);
  }
  const double want_loss = step.run(inputs, targets);
  const auto want_grads = gradients(step);
  runtime::CompiledGraph& graph = step.program().graph();
  ASSERT_GT(graph.size(), 100u);
  for (runtime::NodeId id = 0; id < graph.size(); ++id) {
    SCOPED_TRACE(graph.node(id).name);
    graph.inject_fault(id);
    EXPECT_THAT([&] { (void)step.run(inputs, targets); },
                ThrowsMessage<InjectedFault>(
                    StartsWith("injected fault in node " + graph.node(id).name + " ")));
    EXPECT_EQ(step.run(inputs, targets), want_loss);
    EXPECT_EQ(gradients(step), want_grads);
  }
}

TEST(OperatorFaultTest, AFaultInAnyNodeOfPrefillOrDecodeEndsItOnceAndTheModelRunsAgain) {
  constexpr std::int64_t kModelBatch = 2, kModelPrompt = 4;
  const runtime::DeviceMesh mesh = make_mesh(MeshCase{{2, 2}, {"dp", "tp"}});
  const TransformerConfig c = testing::tiny_moe_lm_config();
  ShardedTransformer model(mesh, c, TransformerWeights::random(c, 7), kModelBatch,
                           kModelPrompt + 1);
  const runtime::HostTensor prompt =
      testing::random_host({kModelBatch, kModelPrompt, c.hidden}, 21, 1.0f);
  const runtime::HostTensor next = testing::random_host({kModelBatch, 1, c.hidden}, 22, 1.0f);
  const runtime::HostTensor want_prefill = model.forward(prompt, 0);
  const runtime::HostTensor want_decode = model.forward(next, kModelPrompt);
  for (const std::int64_t tokens : {kModelPrompt, std::int64_t{1}}) {
    runtime::CompiledGraph& graph = model.program(tokens).graph();
    for (runtime::NodeId id = 0; id < graph.size(); ++id) {
      SCOPED_TRACE(graph.node(id).name);
      graph.inject_fault(id);
      EXPECT_THROW((void)model.forward(tokens == 1 ? next : prompt, tokens == 1 ? kModelPrompt : 0),
                   InjectedFault);
      // A failed prefill may have written part of the cache: prefill again, then decode.
      EXPECT_EQ(model.forward(prompt, 0).data, want_prefill.data);
      EXPECT_EQ(model.forward(next, kModelPrompt).data, want_decode.data);
    }
  }
}

}  // namespace
}  // namespace numesh::ops
