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
#include "numesh/models/engine/gguf_export.hpp"
#include "numesh/models/engine/model_source.hpp"
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

// A GGUF file trains as the folder it was written from: in f32 the same losses bit for bit
// (the Q/K rows' permutation undone, the metadata read back as the same config), in q8_0 from
// its dequantized weights; save() writes a Hugging Face folder that resumes the trajectory,
// Llama 3.1's RoPE scaling included (a rope_freqs tensor in the file). (A file whose
// rope_freqs no llama3 scaling gives is refused: GgufCheckpointTest.)
TEST(TrainerTest, TrainsFromAGgufFileAsFromItsFolder) {
  const ScratchDir dir;
  const nlohmann::json doc = tiny_llama(false);
  const HfConfig config = HfConfig::parse(doc, "config.json");
  write_random_model(dir.path() / "hf", doc, DType::kF32, 5);
  const ModelSource source = ModelSource::open(dir.path() / "hf");
  (void)write_gguf(source, dir.path() / "f32.gguf", DType::kF32);
  (void)write_gguf(source, dir.path() / "q8_0.gguf", DType::kQ8_0);
  const std::vector<std::int32_t> data = counting_rows(8);
  const std::vector<std::int64_t> shape{8, kTokens + 1};
  const TrainingOptions o = options(4, 3e-3, 6);
  const auto losses = [&](CausalLmTrainer& t, std::int64_t from, std::int64_t to) {
    std::vector<double> l;
    for (std::int64_t k = from; k < to; ++k)
      l.push_back(t.step(training_batch(data, shape, k, 4, kTokens)).loss);
    return l;
  };
  CausalLmTrainer folder = CausalLmTrainer::load(mesh_of(2, {"tp"}), dir.path() / "hf", o);
  const std::vector<double> want = losses(folder, 0, 4);
  CausalLmTrainer f32 = CausalLmTrainer::load(mesh_of(2, {"tp"}), dir.path() / "f32.gguf", o);
  EXPECT_EQ(losses(f32, 0, 2), std::vector<double>(want.begin(), want.begin() + 2));
  f32.save(dir.path() / "saved");
  CausalLmTrainer resumed = CausalLmTrainer::load(mesh_of(2, {"tp"}), dir.path() / "saved", o);
  EXPECT_EQ(resumed.steps(), 2);
  EXPECT_EQ(losses(resumed, 2, 4), std::vector<double>(want.begin() + 2, want.end()));
  EXPECT_EQ(HfConfig::load(dir.path() / "saved").intermediate_size, config.intermediate_size);
  // q8_0: the dequantized weights differ from the float ones by the format's rounding.
  CausalLmTrainer q8 = CausalLmTrainer::load(mesh_of(1, {"tp"}), dir.path() / "q8_0.gguf", o);
  const std::vector<double> q8_losses = losses(q8, 0, 4);
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(q8_losses[i], want[i], 0.02) << i;
  // From scratch with the file's config.
  CausalLmTrainer fresh = CausalLmTrainer::from_initial_weights(
      mesh_of(1, {"tp"}), dir.path() / "f32.gguf", 1, options(4, 1e-2, 6));
  EXPECT_NEAR(fresh.step(training_batch(data, shape, 0, 4, kTokens)).loss,
              std::log(static_cast<double>(kVocab)), 0.1);
  // Llama 3.1's scaling goes into a GGUF file as a rope_freqs tensor, and comes out of it as
  // the llama3 scaling in the saved config.json (the same band; factors within 1e-5).
  nlohmann::json scaled = doc;
  scaled["head_dim"] = 64;
  scaled["num_attention_heads"] = 2;
  scaled["num_key_value_heads"] = 1;
  scaled["hidden_size"] = 128;
  scaled["rope_theta"] = 500000.0;
  scaled["rope_scaling"] = {{"rope_type", "llama3"},
                            {"factor", 8.0},
                            {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0},
                            {"original_max_position_embeddings", 1024}};
  write_random_model(dir.path() / "scaled", scaled, DType::kF32, 5);
  (void)write_gguf(ModelSource::open(dir.path() / "scaled"), dir.path() / "scaled.gguf",
                   DType::kF32);
  CausalLmTrainer from_scaled =
      CausalLmTrainer::load(mesh_of(1, {"tp"}), dir.path() / "scaled.gguf", o);
  (void)from_scaled.step(training_batch(data, shape, 0, 4, kTokens));
  from_scaled.save(dir.path() / "scaled_saved");
  const HfConfig saved = HfConfig::load(dir.path() / "scaled_saved");
  EXPECT_EQ(saved.rope_scaling.kind, ops::RopeScaling::Kind::kLlama3);
  EXPECT_EQ(saved.rope_scaling.factor, 8.0);
  EXPECT_EQ(saved.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(saved.rope_scaling.original_max_position, 1024);
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
