// CausalLmTrainer: a tiny model learning a task to a low loss, saving and resuming on the same
// trajectory bit for bit, and refusing bad data, options and checkpoints before any step.
// (Its runs against PyTorch: models_train_like_pytorch.)

#include "numesh/models/lm/trainer.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "check_mesh.hpp"
#include "numesh/core/error.hpp"
#include "numesh/models/formats/safetensors_checkpoint.hpp"
#include "numesh/models/hf/random_model.hpp"
#include "numesh/models/lm/causal_lm.hpp"
#include "safetensors_writer.hpp"

namespace numesh::models {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using testing::ScratchDir;
using ::testing::ThrowsMessage;

constexpr std::int64_t kVocab = 32, kTokens = 16;

json tiny_llama(bool tied) {
  return json{{"model_type", "llama"},    {"vocab_size", kVocab},
              {"hidden_size", 32},        {"intermediate_size", 64},
              {"num_hidden_layers", 2},   {"num_attention_heads", 4},
              {"num_key_value_heads", 2}, {"max_position_embeddings", 64},
              {"rms_norm_eps", 1e-5},     {"tie_word_embeddings", tied}};
}

using testing::mesh_of;

TrainingOptions options(std::int64_t batch, double lr, std::int64_t steps) {
  TrainingOptions o;
  o.batch = batch;
  o.tokens = kTokens;
  o.adamw.weight_decay = 0.0;
  o.schedule = ops::LearningRateSchedule{.lr = lr, .warmup = 10, .total = steps};
  return o;
}

// Counting: row s is s, s + 1, s + 2, ... mod V. Every target follows from its input.
std::vector<std::int32_t> counting_rows(std::int64_t rows) {
  std::vector<std::int32_t> ids;
  for (std::int64_t s = 0; s < rows; ++s) {
    for (std::int64_t t = 0; t <= kTokens; ++t)
      ids.push_back(static_cast<std::int32_t>((s * 7 + t) % kVocab));
  }
  return ids;
}

// The Hugging Face tensors each trained weight is saved as: a dense slot one tensor as it is; a
// MoE router its transpose; stacked experts (stored out-in) one tensor per expert as it is,
// named as the architecture names them.
TEST(HfTensorPartsTest, NameDenseSlotsAndEveryExpert) {
  const std::vector<HfTensorPart> dense =
      hf_tensor_parts("layers.1.mlp.up", Architecture::kLlama, 0);
  ASSERT_EQ(dense.size(), 1u);
  EXPECT_EQ(dense[0].name, "model.layers.1.mlp.up_proj.weight");
  EXPECT_EQ(dense[0].expert, -1);
  EXPECT_FALSE(dense[0].transposed);
  const std::vector<HfTensorPart> router =
      hf_tensor_parts("layers.0.moe.router", Architecture::kMixtral, 4);
  ASSERT_EQ(router.size(), 1u);
  EXPECT_EQ(router[0].name, "model.layers.0.block_sparse_moe.gate.weight");
  EXPECT_TRUE(router[0].transposed);
  const std::vector<HfTensorPart> down =
      hf_tensor_parts("layers.3.moe.down", Architecture::kMixtral, 2);
  ASSERT_EQ(down.size(), 2u);
  EXPECT_EQ(down[1].name, "model.layers.3.block_sparse_moe.experts.1.w2.weight");
  EXPECT_EQ(down[1].expert, 1);
  EXPECT_FALSE(down[1].transposed);  // the experts are stored out-in, as nn.Linear holds them
  EXPECT_EQ(hf_tensor_parts("layers.2.moe.gate", Architecture::kQwen3Moe, 3)[2].name,
            "model.layers.2.mlp.experts.2.gate_proj.weight");
  EXPECT_THAT([] { hf_tensor_parts("layers.2.moe.shared", Architecture::kMixtral, 3); },
              ThrowsMessage<KeyError>(HasSubstr(
                  "no Hugging Face tensor is known for the weight 'layers.2.moe.shared'")));
  EXPECT_THAT([] { hf_tensor_parts("layers.x.attention.wq", Architecture::kLlama, 0); },
              ThrowsMessage<KeyError>(HasSubstr("'layers.x.attention.wq'")));
}

TEST(TrainerTest, LearnsToCount) {
  const std::int64_t steps = 120;
  const HfConfig config = HfConfig::parse(tiny_llama(false), "config.json");
  CausalLmTrainer trainer(mesh_of(2, {"dp"}), tiny_llama(false), initial_weights(config, 1),
                          options(8, 1e-2, steps));
  const std::vector<std::int32_t> data = counting_rows(32);
  const std::vector<std::int64_t> shape{32, kTokens + 1};
  StepStats first, last;
  for (std::int64_t k = 0; k < steps; ++k) {
    last = trainer.step(training_batch(data, shape, k, 8, kTokens));
    if (k == 0) first = last;
  }
  // From chance (ln 32 = 3.47) to a loss of a model that counts.
  EXPECT_NEAR(first.loss, std::log(static_cast<double>(kVocab)), 0.1);
  EXPECT_LT(last.loss, 0.05) << "after " << steps << " steps";
  EXPECT_EQ(last.step, steps);
  EXPECT_EQ(trainer.steps(), steps);
}

// Saving after 3 steps and resuming in a new trainer gives the losses and weights of 6 steps in
// one go, bit for bit (on the same mesh: another mesh sums in another order, within rounding,
// which models_train_like_pytorch checks).
TEST(TrainerTest, ResumesTheSameTrajectoryExactly) {
  const ScratchDir dir;
  for (const bool tied : {false, true}) {
    const HfConfig config = HfConfig::parse(tiny_llama(tied), "config.json");
    const CausalLmWeights start = initial_weights(config, 2);
    const std::vector<std::int32_t> data = counting_rows(8);
    const std::vector<std::int64_t> shape{8, kTokens + 1};
    const TrainingOptions o = options(4, 3e-3, 6);
    CausalLmTrainer straight(mesh_of(2, {"tp"}), tiny_llama(tied), start, o);
    std::vector<double> want;
    for (std::int64_t k = 0; k < 6; ++k)
      want.push_back(straight.step(training_batch(data, shape, k, 4, kTokens)).loss);
    straight.save(dir.path() / "straight");

    CausalLmTrainer first(mesh_of(2, {"tp"}), tiny_llama(tied), start, o);
    std::vector<double> got;
    for (std::int64_t k = 0; k < 3; ++k)
      got.push_back(first.step(training_batch(data, shape, k, 4, kTokens)).loss);
    first.save(dir.path() / "half");
    CausalLmTrainer resumed = CausalLmTrainer::load(mesh_of(2, {"tp"}), dir.path() / "half", o);
    ASSERT_EQ(resumed.steps(), 3);
    for (std::int64_t k = 3; k < 6; ++k)
      got.push_back(resumed.step(training_batch(data, shape, k, 4, kTokens)).loss);
    resumed.save(dir.path() / "resumed");
    EXPECT_EQ(got, want) << (tied ? "tied" : "untied");
    // The saved model loads for inference, and both checkpoints hold the same weights.
    const SafetensorsCheckpoint a = SafetensorsCheckpoint::open(dir.path() / "straight");
    const SafetensorsCheckpoint b = SafetensorsCheckpoint::open(dir.path() / "resumed");
    const CausalLmWeights wa = CausalLmWeights::load(config, a),
                          wb = CausalLmWeights::load(config, b);
    EXPECT_EQ(wa.stack.blocks[1].mlp.down.data, wb.stack.blocks[1].mlp.down.data);
    EXPECT_EQ(wa.embedding.table.data, wb.embedding.table.data);
    EXPECT_NE(wa.embedding.table.data, start.embedding.table.data);  // it did train
    CausalLm lm = CausalLm::load(mesh_of(1, {"tp"}), config, a, 1, 8);
    EXPECT_EQ(lm.greedy(std::vector<std::int32_t>{1, 2, 3}, 3, 0).size(), 1u);
  }
}

// A step cancelled (Ctrl-C in Python) before it begins or part-way through its forward and
// backward graph is not taken: the weights and AdamW's state are as they were, and the
// trajectory goes on bit for bit as if the step had not been asked for.
TEST(TrainerTest, ACancelledStepIsNotTaken) {
  const HfConfig config = HfConfig::parse(tiny_llama(false), "config.json");
  const CausalLmWeights start = initial_weights(config, 3);
  const std::vector<std::int32_t> data = counting_rows(8);
  const std::vector<std::int64_t> shape{8, kTokens + 1};
  const TrainingOptions o = options(4, 3e-3, 40);
  const auto batch = [&](std::int64_t k) { return training_batch(data, shape, k, 4, kTokens); };
  const runtime::DeviceMesh two = mesh_of(2, {"tp"});
  CausalLmTrainer straight(two, tiny_llama(false), start, o);
  std::vector<double> want;
  for (std::int64_t k = 0; k < 4; ++k) want.push_back(straight.step(batch(k)).loss);

  CausalLmTrainer cut(two, tiny_llama(false), start, o);
  std::vector<double> got;
  for (std::int64_t k = 0; k < 4; ++k) {
    runtime::CancelSource source;
    if (k % 2 == 0) {
      source.cancel();
      const runtime::CancelScope scope(source);
      EXPECT_THAT([&] { cut.step(batch(k)); },
                  ThrowsMessage<CancelledError>(HasSubstr("before it began")));
    } else {
      const runtime::testing::CancelMidRun cancel(two.device(0), source);
      const runtime::CancelScope scope(source);
      EXPECT_THAT([&] { cut.step(batch(k)); },
                  ThrowsMessage<CancelledError>("graph run cancelled by the caller"));
    }
    EXPECT_EQ(cut.steps(), k) << "step " << k;
    got.push_back(cut.step(batch(k)).loss);
  }
  EXPECT_EQ(got, want);
}

TEST(TrainerTest, RefusesBadDataAndCheckpointsBeforeWork) {
  const HfConfig config = HfConfig::parse(tiny_llama(false), "config.json");
  const CausalLmWeights start = initial_weights(config, 3);
  const std::vector<std::int32_t> data = counting_rows(3);
  const std::vector<std::int64_t> shape{3, kTokens + 1};
  EXPECT_THAT([&] { training_batch(data, shape, 0, 4, kTokens); },
              ThrowsMessage<ShapeError>(
                  HasSubstr("training data holds 3 sequences, fewer than one batch of 4")));
  EXPECT_THAT([&] { training_batch(data, shape, 0, 2, kTokens + 1); },
              ThrowsMessage<ShapeError>(HasSubstr("training data is [3, 17]; it must be [S, 18]")));
  EXPECT_THAT(
      [&] { CausalLmTrainer(mesh_of(2, {"dp"}), tiny_llama(false), start, options(3, 1e-3, 1)); },
      ThrowsMessage<ShapeError>(
          HasSubstr("a batch of 3 sequences does not split over the data-parallel axes")));
  TrainingOptions bad_clip = options(2, 1e-3, 1);
  bad_clip.clip = -1.0;
  EXPECT_THAT([&] { CausalLmTrainer(mesh_of(1, {"tp"}), tiny_llama(false), start, bad_clip); },
              ThrowsMessage<ValueError>(HasSubstr("clip -1 must be 0 (none) or positive")));

  CausalLmTrainer trainer(mesh_of(1, {"tp"}), tiny_llama(false), start, options(2, 1e-3, 1));
  std::vector<std::int32_t> rows = training_batch(data, shape, 0, 2, kTokens);
  rows[kTokens + 1 + 5] = static_cast<std::int32_t>(kVocab);
  EXPECT_THAT([&] { trainer.step(rows); },
              ThrowsMessage<IndexError>(
                  HasSubstr("input id 32 of sequence 1 at position 5 is outside the vocabulary")));
  EXPECT_THAT([&] { trainer.step(std::vector<std::int32_t>(5, 0)); },
              ThrowsMessage<ShapeError>(HasSubstr("5 ids for a batch of 2 rows of 17 ids")));
  EXPECT_EQ(trainer.steps(), 0);

  // A checkpoint that does not fit the config, and optimizer state that does not fit the model.
  const ScratchDir dir;
  trainer.save(dir.path() / "saved");
  json wider = tiny_llama(false);
  wider["intermediate_size"] = 96;
  std::ofstream(dir.path() / "saved" / "config.json") << wider.dump();
  EXPECT_THAT(
      [&] { CausalLmTrainer::load(mesh_of(1, {"tp"}), dir.path() / "saved", options(2, 1e-3, 1)); },
      ThrowsMessage<ShapeError>(
          HasSubstr("mlp.gate_proj.weight is [64, 32], the config implies [96, 32]")));

  // A step whose gradients are not finite leaves the weights as they were.
  CausalLmWeights broken = start;
  broken.stack.final_norm.data[0] = std::numeric_limits<float>::quiet_NaN();
  CausalLmTrainer nan_trainer(mesh_of(1, {"tp"}), tiny_llama(false), broken, options(2, 1e-3, 1));
  EXPECT_THAT([&] { nan_trainer.step(training_batch(data, shape, 0, 2, kTokens)); },
              ThrowsMessage<ValueError>(HasSubstr("step 1 has a gradient norm of nan")));
  EXPECT_EQ(nan_trainer.steps(), 0);
}

}  // namespace
}  // namespace numesh::models
