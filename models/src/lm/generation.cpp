#include "numesh/models/lm/generation.hpp"

#include <algorithm>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/models/lm/generator.hpp"
#include "numesh/ops/lowering/lm_head.hpp"

namespace numesh::models {

const char* to_string(StopReason reason) noexcept {
  return reason == StopReason::kStopId ? "stop id" : "max new tokens";
}

GenerationResult generate(
    CausalLm& lm, const std::vector<std::vector<std::int32_t>>& prompts,
    const GenerationOptions& options, std::mt19937_64& rng,
    const std::function<void(std::int64_t, std::span<const std::int64_t>)>& on_tokens) {
  const std::int64_t batch = lm.batch();
  NUMESH_CHECK(static_cast<std::int64_t>(prompts.size()) == batch, ShapeError,
               "generate: {} prompts for a model of {} sequences", prompts.size(), batch);
  NUMESH_CHECK(options.max_new_tokens >= 1, ValueError,
               "generate: max_new_tokens {} must be at least 1", options.max_new_tokens);
  if (options.sampling) ops::validate(*options.sampling);
  std::int64_t longest = 0;
  for (std::size_t b = 0; b < prompts.size(); ++b) {
    NUMESH_CHECK(!prompts[b].empty(), ShapeError, "generate: prompt {} is empty", b);
    longest = std::max(longest, static_cast<std::int64_t>(prompts[b].size()));
  }
  // The longest prompt's last new token goes to position longest + max_new_tokens - 2, and the
  // prefill itself needs longest positions.
  NUMESH_CHECK(longest + options.max_new_tokens - 1 <= lm.max_len(), IndexError,
               "generate: the longest prompt ({} tokens) and {} new tokens do not fit the model's "
               "{} positions",
               longest, options.max_new_tokens, lm.max_len());

  // The prompts in slot order, prefilled together at the first step; then decode steps until
  // every sequence has stopped. Sequence b is the b-th admitted.
  Generator generator(lm);
  const auto sequences = static_cast<std::size_t>(batch);
  for (const std::vector<std::int32_t>& prompt : prompts) generator.admit(prompt, options);
  GenerationResult result;
  result.stopped.assign(sequences, StopReason::kMaxNewTokens);
  std::vector<std::int64_t> next(sequences);
  while (generator.has_work()) {
    const StepOutput step = generator.step(rng);
    std::fill(next.begin(), next.end(), -1);
    for (const StepOutput::Token& token : step.tokens) {
      const auto b = static_cast<std::size_t>(token.sequence);
      next[b] = token.id;
      if (token.stopped) result.stopped[b] = *token.stopped;
    }
    if (step.kind == StepOutput::Kind::kPrefill) {
      result.prefill_seconds += step.seconds;
    } else {
      result.decode_seconds += step.seconds;
      ++result.decode_steps;
      result.decoded_tokens += step.computed_tokens;
    }
    if (on_tokens) on_tokens(result.decode_steps, next);
  }
  for (std::size_t b = 0; b < sequences; ++b) {
    const auto id = static_cast<SequenceId>(b);
    result.ids.push_back(generator.generated(id));
    if (options.keep_logits) result.logits.push_back(generator.logits(id));
  }
  return result;
}

}  // namespace numesh::models
