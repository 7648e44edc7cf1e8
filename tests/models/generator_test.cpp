// Generator: sequences admitted, stepped and retired over a CausalLm's slots give the tokens
// each gives alone (generate() with one prompt), whenever they are admitted and whatever rides
// beside them; every bad call is refused naming what is wrong, and changes nothing.

#include "numesh/models/lm/generator.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "check_mesh.hpp"
#include "numesh/core/error.hpp"
#include "numesh/models/formats/safetensors_checkpoint.hpp"
#include "numesh/models/hf/random_model.hpp"
#include "numesh/models/lm/generation.hpp"
#include "safetensors_writer.hpp"
#include "small_llama.hpp"

namespace numesh::models {
namespace {

using testing::mesh_of;
using testing::ScratchDir;
using ::testing::ThrowsMessage;

CausalLm load(const ScratchDir& dir, const HfConfig& config, runtime::DeviceMesh mesh,
              std::int64_t slots) {
  return CausalLm::load(std::move(mesh), config, SafetensorsCheckpoint::open(dir.path()), slots,
                        24);
}

// What `prompt` gives alone: generate() on a one-slot model.
GenerationResult alone(const ScratchDir& dir, const HfConfig& config,
                       const std::vector<std::int32_t>& prompt, const GenerationOptions& options) {
  CausalLm one = load(dir, config, mesh_of(1, {"tp"}), 1);
  std::mt19937_64 rng(3);
  return generate(one, {prompt}, options, rng);
}

// Steps until `sequence` stops; returns the kinds of the steps taken.
std::vector<StepOutput::Kind> step_until_stopped(Generator& g, SequenceId sequence,
                                                 std::mt19937_64& rng) {
  std::vector<StepOutput::Kind> kinds;
  for (bool stopped = false; !stopped;) {
    const StepOutput out = g.step(rng);
    kinds.push_back(out.kind);
    for (const StepOutput::Token& t : out.tokens) stopped |= t.sequence == sequence && t.stopped;
  }
  return kinds;
}

TEST(GeneratorTest, SequencesAdmittedAtAnyTimeGiveWhatEachGivesAlone) {
  ScratchDir dir;
  const HfConfig config = testing::write_small_llama(dir);
  const std::vector<std::vector<std::int32_t>> prompts{
      {3, 40, 5, 61, 7}, {9, 200}, {11, 12, 130}, {30}, {77, 78, 79, 80, 81, 82}};
  const std::vector<GenerationOptions> options{{.max_new_tokens = 6},
                                               {.max_new_tokens = 3},
                                               {.max_new_tokens = 5, .keep_logits = true},
                                               {.max_new_tokens = 4},
                                               {.max_new_tokens = 2}};
  std::vector<GenerationResult> expected;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    expected.push_back(alone(dir, config, prompts[i], options[i]));
  }
  for (const auto& [n, axis] :
       std::vector<std::pair<int, std::string>>{{1, "tp"}, {2, "tp"}, {2, "dp"}}) {
    SCOPED_TRACE(std::to_string(n) + " " + axis);
    CausalLm lm = load(dir, config, mesh_of(n, {axis}), 4);
    Generator g(lm);
    std::mt19937_64 rng(3);
    EXPECT_FALSE(g.has_work());
    EXPECT_EQ(g.free_slots(), 4);
    // Two prompts prefilled together (one keeps its logits: the step picks on the host).
    const SequenceId a = g.admit(prompts[0], options[0]);
    const SequenceId c = g.admit(prompts[2], options[2]);
    StepOutput first = g.step(rng);
    EXPECT_EQ(first.kind, StepOutput::Kind::kPrefill);
    EXPECT_EQ(first.computed_tokens, 5 + 3) << "the prompts' tokens, without the padding";
    ASSERT_EQ(first.tokens.size(), 2u);
    EXPECT_EQ(first.tokens[0].sequence, a);
    EXPECT_EQ(first.tokens[1].sequence, c);
    // A prompt admitted while they decode waits until neither does.
    const SequenceId b = g.admit(prompts[1], options[1]);
    EXPECT_EQ(g.free_slots(), 1);
    const std::vector<StepOutput::Kind> kinds = step_until_stopped(g, c, rng);
    EXPECT_EQ(kinds, std::vector<StepOutput::Kind>(4, StepOutput::Kind::kDecode));
    EXPECT_EQ(g.generated(c), expected[2].ids[0]);
    EXPECT_EQ(g.logits(c).size(), expected[2].logits[0].size());
    g.retire(c);
    step_until_stopped(g, a, rng);
    EXPECT_EQ(g.generated(a), expected[0].ids[0]);
    EXPECT_TRUE(g.logits(a).empty()) << "a did not keep its logits";
    // Now b is prefilled, with d admitted beside it; a rides along stopped until retired.
    const SequenceId d = g.admit(prompts[3], options[3]);
    EXPECT_EQ(g.step(rng).kind, StepOutput::Kind::kPrefill);
    g.retire(a);
    const SequenceId e = g.admit(prompts[4], options[4]);
    while (g.has_work()) (void)g.step(rng);
    EXPECT_EQ(g.generated(b), expected[1].ids[0]);
    EXPECT_EQ(g.generated(d), expected[3].ids[0]);
    EXPECT_EQ(g.generated(e), expected[4].ids[0]);
    for (const SequenceId s : {b, d, e}) g.retire(s);
    EXPECT_EQ(g.free_slots(), 4);
  }
}

TEST(GeneratorTest, KeptLogitsAreThoseOfTheSequenceAlone) {
  ScratchDir dir;
  const HfConfig config = testing::write_small_llama(dir);
  const GenerationOptions keep{.max_new_tokens = 4, .keep_logits = true};
  const GenerationResult expected = alone(dir, config, {5, 6, 7}, keep);
  CausalLm lm = load(dir, config, mesh_of(2, {"tp"}), 2);
  Generator g(lm);
  std::mt19937_64 rng(3);
  const SequenceId s = g.admit({5, 6, 7}, keep);
  (void)g.admit({100, 101, 102, 103, 104, 105, 106}, {.max_new_tokens = 3});
  while (g.has_work()) (void)g.step(rng);
  ASSERT_EQ(g.logits(s).size(), expected.logits[0].size()) << "[P + N - 1, V]";
  for (std::size_t i = 0; i < expected.logits[0].size(); ++i) {
    ASSERT_NEAR(g.logits(s)[i], expected.logits[0][i], 1e-4) << "element " << i;
  }
}

// A prompt of the caches' whole length that stops at its prefill holds a position past them;
// riding along in the others' decode steps it must not fail them.
TEST(GeneratorTest, ASequenceStoppedAtAFullLengthPrefillRidesAlong) {
  ScratchDir dir;
  const HfConfig config = testing::write_small_llama(dir);
  CausalLm lm = load(dir, config, mesh_of(1, {"tp"}), 2);
  Generator g(lm);
  std::mt19937_64 rng(3);
  const SequenceId full = g.admit(std::vector<std::int32_t>(24, 5), {.max_new_tokens = 1});
  const SequenceId other = g.admit({1, 2, 3}, {.max_new_tokens = 4});
  while (g.has_work()) (void)g.step(rng);
  EXPECT_EQ(g.generated(full).size(), 1u);
  EXPECT_EQ(g.generated(other), alone(dir, config, {1, 2, 3}, {.max_new_tokens = 4}).ids[0]);
}

TEST(GeneratorTest, BadCallsAreRefusedByNameAndChangeNothing) {
  ScratchDir dir;
  const HfConfig config = testing::write_small_llama(dir);
  CausalLm lm = load(dir, config, mesh_of(1, {"tp"}), 2);
  Generator g(lm);
  std::mt19937_64 rng(3);
  EXPECT_THAT([&] { (void)g.step(rng); },
              ThrowsMessage<ValueError>("step: no sequence waits or runs"));
  EXPECT_THAT([&] { g.admit({}, {}); }, ThrowsMessage<ShapeError>("admit: the prompt is empty"));
  EXPECT_THAT(
      [&] {
        g.admit({1, 256}, {});
      },
      ThrowsMessage<IndexError>(
          "admit: token 256 at position 1 is outside the model's vocabulary [0, 256)"));
  EXPECT_THAT([&] { g.admit({-1}, {}); },
              ThrowsMessage<IndexError>(
                  "admit: token -1 at position 0 is outside the model's vocabulary [0, 256)"));
  EXPECT_THAT([&] { g.admit({1}, {.max_new_tokens = 0}); },
              ThrowsMessage<ValueError>("admit: max_new_tokens 0 must be at least 1"));
  EXPECT_THAT(
      [&] {
        g.admit({1, 2, 3}, {.max_new_tokens = 23});
      },
      ThrowsMessage<IndexError>(
          "admit: a prompt of 3 tokens and 23 new tokens do not fit the model's 24 "
          "positions"));
  EXPECT_THAT([&] { g.admit({1}, {.sampling = ops::SamplingOptions{.temperature = 0.0}}); },
              ThrowsMessage<ValueError>(::testing::HasSubstr("temperature")));
  EXPECT_EQ(g.free_slots(), 2) << "a refused admission holds no slot";
  const SequenceId a = g.admit({1, 2, 3}, {.max_new_tokens = 22});
  (void)g.admit({4}, {.max_new_tokens = 2});
  EXPECT_THAT([&] { g.admit({5}, {}); },
              ThrowsMessage<ValueError>("admit: all 2 slots hold a sequence; retire one first"));
  g.retire(a);
  EXPECT_THAT([&] { g.retire(a); },
              ThrowsMessage<KeyError>("retire: no sequence 0 (never admitted, or retired)"));
  EXPECT_THAT([&] { (void)g.generated(7); },
              ThrowsMessage<KeyError>("generated: no sequence 7 (never admitted, or retired)"));
  EXPECT_THAT([&] { (void)g.logits(a); },
              ThrowsMessage<KeyError>("logits: no sequence 0 (never admitted, or retired)"));
  EXPECT_EQ(g.free_slots(), 1);
  while (g.has_work()) (void)g.step(rng);
  EXPECT_EQ(g.generated(1).size(), 2u) << "the one left ran to max_new_tokens";
}

}  // namespace
}  // namespace numesh::models
