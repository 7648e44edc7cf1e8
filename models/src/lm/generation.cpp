#include "numesh/models/lm/generation.hpp"

#include <algorithm>
#include <chrono>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/timing.hpp"
#include "numesh/ops/kernels/argmax.hpp"
#include "numesh/ops/lowering/lm_head.hpp"

namespace numesh::models {

namespace {

using Clock = std::chrono::steady_clock;

// The pick from one row of whole logits, by the rules the devices follow: the argmax, or a
// draw with every token a candidate.
std::int64_t pick_from_row(std::span<const float> row, const GenerationOptions& options,
                           std::mt19937_64& rng) {
  const auto v = static_cast<std::int64_t>(row.size());
  if (!options.sampling) {
    // The devices' argmax kernel on the one row: its value, then its index as an fp32 number.
    float best[2];
    ops::row_argmax(ops::ConstMatrixMap(row.data(), 1, v), 0, best);
    return static_cast<std::int64_t>(best[1]);
  }
  // pick_sampled's candidates: (logit, id) pairs.
  runtime::HostTensor candidates = runtime::HostTensor::zeros({1, 2 * v});
  for (std::int64_t j = 0; j < v; ++j) {
    candidates.data[static_cast<std::size_t>(2 * j)] = row[static_cast<std::size_t>(j)];
    candidates.data[static_cast<std::size_t>(2 * j + 1)] = static_cast<float>(j);
  }
  return ops::pick_sampled(candidates, *options.sampling, rng).front();
}

}  // namespace

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

  GenerationResult result;
  const auto sequences = static_cast<std::size_t>(batch);
  result.ids.resize(sequences);
  result.stopped.assign(sequences, StopReason::kMaxNewTokens);
  if (options.keep_logits) result.logits.resize(sequences);
  std::vector<bool> running(sequences, true);
  std::vector<std::int64_t> picked(sequences);
  const auto record = [&](std::size_t b, std::int64_t id) {
    result.ids[b].push_back(id);
    picked[b] = id;
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), id) != options.stop_ids.end()) {
      result.stopped[b] = StopReason::kStopId;
      running[b] = false;
    } else if (static_cast<std::int64_t>(result.ids[b].size()) >= options.max_new_tokens) {
      running[b] = false;
    }
  };
  // One call of T tokens per sequence at `at`; each running sequence's pick recorded.
  const auto call = [&](std::span<const std::int32_t> ids, std::int64_t tokens,
                        const TokenPositions& at, const std::vector<std::int64_t>& real) {
    std::vector<std::int64_t> next(sequences, -1);
    if (options.keep_logits) {
      const runtime::HostTensor l = lm.logits(ids, tokens, at);
      const std::int64_t v = l.shape[1];
      for (std::size_t b = 0; b < sequences; ++b) {
        if (!running[b]) continue;
        const auto first_row = static_cast<std::int64_t>(b) * tokens;
        const auto rows = l.data.begin() + first_row * v;
        result.logits[b].insert(result.logits[b].end(), rows, rows + real[b] * v);
        next[b] = pick_from_row(
            std::span<const float>(&*(rows + at.last[b] * v), static_cast<std::size_t>(v)), options,
            rng);
      }
    } else {
      const std::vector<std::int64_t> all = options.sampling
                                                ? lm.sample(ids, tokens, at, *options.sampling, rng)
                                                : lm.greedy(ids, tokens, at);
      for (std::size_t b = 0; b < sequences; ++b) {
        if (running[b]) next[b] = all[b];
      }
    }
    for (std::size_t b = 0; b < sequences; ++b) {
      if (running[b]) record(b, next[b]);
    }
    return next;
  };

  // The prefill: every prompt padded at its end with its own last token to the longest.
  std::vector<std::int32_t> padded(sequences * static_cast<std::size_t>(longest));
  TokenPositions at = TokenPositions::level(batch, 0, longest);
  std::vector<std::int64_t> real(sequences);
  for (std::size_t b = 0; b < sequences; ++b) {
    const std::vector<std::int32_t>& p = prompts[b];
    auto row = padded.begin() + static_cast<std::ptrdiff_t>(b * static_cast<std::size_t>(longest));
    std::copy(p.begin(), p.end(), row);
    std::fill(row + static_cast<std::ptrdiff_t>(p.size()), row + longest, p.back());
    real[b] = static_cast<std::int64_t>(p.size());
    at.last[b] = real[b] - 1;
  }
  const auto prefill_start = Clock::now();
  std::vector<std::int64_t> next = call(padded, longest, at, real);
  result.prefill_seconds = seconds_since(prefill_start);
  if (on_tokens) on_tokens(0, next);

  // Decode: sequence b's k-th generated token goes in at position P_b + k - 1 (at most
  // P_b + max_new_tokens - 2); a stopped sequence holds its last position, rewriting it, and its
  // row is ignored.
  std::vector<std::int64_t> positions(sequences);
  for (std::size_t b = 0; b < sequences; ++b) positions[b] = real[b];
  std::fill(real.begin(), real.end(), 1);
  const auto decode_start = Clock::now();
  std::vector<std::int32_t> fed(sequences);
  while (std::find(running.begin(), running.end(), true) != running.end()) {
    for (std::size_t b = 0; b < sequences; ++b) {
      fed[b] = static_cast<std::int32_t>(picked[b]);
      at.first[b] = positions[b];
      at.last[b] = 0;
    }
    const std::vector<bool> was_running = running;
    next = call(fed, 1, at, real);
    ++result.decode_steps;
    for (std::size_t b = 0; b < sequences; ++b) {
      if (was_running[b]) ++result.decoded_tokens;
      if (running[b]) ++positions[b];  // a sequence that just stopped holds the position it wrote
    }
    if (on_tokens) on_tokens(result.decode_steps, next);
  }
  result.decode_seconds = seconds_since(decode_start);
  return result;
}

}  // namespace numesh::models
