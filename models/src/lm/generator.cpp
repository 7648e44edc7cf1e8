#include "numesh/models/lm/generator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <string>

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

bool same_sampling(const std::optional<ops::SamplingOptions>& a,
                   const std::optional<ops::SamplingOptions>& b) {
  if (!a || !b) return a.has_value() == b.has_value();
  return a->temperature == b->temperature && a->top_k == b->top_k && a->top_p == b->top_p;
}

}  // namespace

Generator::Generator(CausalLm& lm) : lm_(&lm), slots_(static_cast<std::size_t>(lm.batch())) {}

SequenceId Generator::admit(std::vector<std::int32_t> prompt, const GenerationOptions& options) {
  const auto free = std::find_if(slots_.begin(), slots_.end(),
                                 [](const Slot& s) { return s.state == State::kFree; });
  NUMESH_CHECK(free != slots_.end(), ValueError,
               "admit: all {} slots hold a sequence; retire one first", slots_.size());
  NUMESH_CHECK(options.max_new_tokens >= 1, ValueError,
               "admit: max_new_tokens {} must be at least 1", options.max_new_tokens);
  if (options.sampling) ops::validate(*options.sampling);
  NUMESH_CHECK(!prompt.empty(), ShapeError, "admit: the prompt is empty");
  const std::int64_t vocab = lm_->config().vocab_size;
  for (std::size_t i = 0; i < prompt.size(); ++i) {
    const bool inside = prompt[i] >= 0 && prompt[i] < vocab;
    NUMESH_CHECK(inside, IndexError,
                 "admit: token {} at position {} is outside the model's vocabulary [0, {})",
                 prompt[i], i, vocab);
  }
  // The last new token is not fed: the prompt and max_new_tokens - 1 generated tokens go in.
  const auto length = static_cast<std::int64_t>(prompt.size());
  NUMESH_CHECK(length + options.max_new_tokens - 1 <= lm_->max_len(), IndexError,
               "admit: a prompt of {} tokens and {} new tokens do not fit the model's {} "
               "positions",
               length, options.max_new_tokens, lm_->max_len());
  *free = Slot{.state = State::kWaiting,
               .id = next_id_,
               .prompt = std::move(prompt),
               .options = options,
               .generated = {},
               .logits = {},
               .position = 0};
  return next_id_++;
}

bool Generator::has_work() const noexcept {
  return std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) {
    return s.state == State::kWaiting || s.state == State::kRunning;
  });
}

std::int64_t Generator::free_slots() const noexcept {
  return std::count_if(slots_.begin(), slots_.end(),
                       [](const Slot& s) { return s.state == State::kFree; });
}

std::size_t Generator::slot_of(SequenceId sequence, const char* call) const {
  const auto it = std::find_if(slots_.begin(), slots_.end(), [&](const Slot& s) {
    return s.state != State::kFree && s.id == sequence;
  });
  if (it == slots_.end()) {
    throw KeyError(std::to_string(sequence),
                   fmt::format("{}: no sequence {} (never admitted, or retired)", call, sequence));
  }
  return static_cast<std::size_t>(it - slots_.begin());
}

const std::vector<std::int64_t>& Generator::generated(SequenceId sequence) const {
  return slots_[slot_of(sequence, "generated")].generated;
}

const std::vector<float>& Generator::logits(SequenceId sequence) const {
  return slots_[slot_of(sequence, "logits")].logits;
}

void Generator::retire(SequenceId sequence) { slots_[slot_of(sequence, "retire")] = Slot{}; }

StepOutput Generator::step(std::mt19937_64& rng) {
  const bool running = std::any_of(slots_.begin(), slots_.end(),
                                   [](const Slot& s) { return s.state == State::kRunning; });
  if (running) return decode(rng);
  NUMESH_CHECK(has_work(), ValueError, "step: no sequence waits or runs");
  return prefill(rng);
}

StepOutput::Token Generator::record(Slot& slot, std::int64_t id) {
  StepOutput::Token token{.sequence = slot.id, .id = id, .stopped = std::nullopt};
  slot.generated.push_back(id);
  const std::vector<std::int64_t>& stops = slot.options.stop_ids;
  if (std::find(stops.begin(), stops.end(), id) != stops.end()) {
    token.stopped = StopReason::kStopId;
  } else if (static_cast<std::int64_t>(slot.generated.size()) >= slot.options.max_new_tokens) {
    token.stopped = StopReason::kMaxNewTokens;
  }
  if (token.stopped) slot.state = State::kStopped;
  return token;
}

std::vector<std::int64_t> Generator::call(std::span<const std::int32_t> ids, std::int64_t tokens,
                                          const TokenPositions& at,
                                          const std::vector<bool>& taking_part,
                                          const std::vector<std::int64_t>& real,
                                          std::mt19937_64& rng) {
  const std::size_t sequences = slots_.size();
  // The devices pick when every sequence taking part picks alike and none keeps its logits;
  // otherwise the whole logits come to the host and each sequence picks by its own options.
  const Slot* first = nullptr;
  bool on_host = false;
  for (std::size_t b = 0; b < sequences; ++b) {
    if (!taking_part[b]) continue;
    const Slot& s = slots_[b];
    if (first == nullptr) first = &s;
    on_host = on_host || s.options.keep_logits ||
              !same_sampling(s.options.sampling, first->options.sampling);
  }
  std::vector<std::int64_t> next(sequences, -1);
  if (on_host) {
    const runtime::HostTensor l = lm_->logits(ids, tokens, at);
    const std::int64_t v = l.shape[1];
    for (std::size_t b = 0; b < sequences; ++b) {
      if (!taking_part[b]) continue;
      Slot& s = slots_[b];
      const auto rows = l.data.begin() + static_cast<std::int64_t>(b) * tokens * v;
      if (s.options.keep_logits) s.logits.insert(s.logits.end(), rows, rows + real[b] * v);
      next[b] = pick_from_row(
          std::span<const float>(&*(rows + at.last[b] * v), static_cast<std::size_t>(v)), s.options,
          rng);
    }
    return next;
  }
  const std::vector<std::int64_t> all =
      first->options.sampling ? lm_->sample(ids, tokens, at, *first->options.sampling, rng)
                              : lm_->greedy(ids, tokens, at);
  for (std::size_t b = 0; b < sequences; ++b) {
    if (taking_part[b]) next[b] = all[b];
  }
  return next;
}

StepOutput Generator::prefill(std::mt19937_64& rng) {
  const std::size_t sequences = slots_.size();
  std::vector<bool> waiting(sequences);
  std::int64_t longest = 1;
  StepOutput out;
  out.kind = StepOutput::Kind::kPrefill;
  for (std::size_t b = 0; b < sequences; ++b) {
    waiting[b] = slots_[b].state == State::kWaiting;
    if (!waiting[b]) continue;
    longest = std::max(longest, static_cast<std::int64_t>(slots_[b].prompt.size()));
    out.computed_tokens += static_cast<std::int64_t>(slots_[b].prompt.size());
  }
  // Every waiting prompt padded at its end with its own last token to the longest (see
  // ShardedTransformer::forward for why the padding changes nothing); the other slots are
  // fillers (token 0) at position 0, which no sequence of theirs will read again.
  std::vector<std::int32_t> padded(sequences * static_cast<std::size_t>(longest), 0);
  TokenPositions at = TokenPositions::level(static_cast<std::int64_t>(sequences), 0, longest);
  std::vector<std::int64_t> real(sequences, longest);
  for (std::size_t b = 0; b < sequences; ++b) {
    if (!waiting[b]) continue;
    const std::vector<std::int32_t>& p = slots_[b].prompt;
    auto row = padded.begin() + static_cast<std::ptrdiff_t>(b * static_cast<std::size_t>(longest));
    std::copy(p.begin(), p.end(), row);
    std::fill(row + static_cast<std::ptrdiff_t>(p.size()), row + longest, p.back());
    real[b] = static_cast<std::int64_t>(p.size());
    at.last[b] = real[b] - 1;
  }
  const auto start = Clock::now();
  const std::vector<std::int64_t> next = call(padded, longest, at, waiting, real, rng);
  out.seconds = seconds_since(start);
  for (std::size_t b = 0; b < sequences; ++b) {
    if (!waiting[b]) continue;
    Slot& s = slots_[b];
    s.state = State::kRunning;
    s.position = static_cast<std::int64_t>(s.prompt.size());
    out.tokens.push_back(record(s, next[b]));
  }
  return out;
}

StepOutput Generator::decode(std::mt19937_64& rng) {
  // Sequence b's k-th generated token goes in at position P_b + k - 1 (at most
  // P_b + max_new_tokens - 2); a stopped sequence holds its last position, rewriting it with
  // its last token, and a waiting or free slot is a filler at position 0.
  const std::size_t sequences = slots_.size();
  std::vector<bool> running(sequences);
  std::vector<std::int32_t> fed(sequences, 0);
  TokenPositions at = TokenPositions::level(static_cast<std::int64_t>(sequences), 0, 1);
  for (std::size_t b = 0; b < sequences; ++b) {
    const Slot& s = slots_[b];
    running[b] = s.state == State::kRunning;
    if (running[b] || s.state == State::kStopped) {
      fed[b] = static_cast<std::int32_t>(s.generated.back());
      // A sequence that stopped at its prefill with a prompt of max_len tokens holds a position
      // past the caches: it rewrites the last one (its own, never read again).
      at.first[b] = std::min(s.position, lm_->max_len() - 1);
    }
  }
  const std::vector<std::int64_t> real(sequences, 1);
  const auto start = Clock::now();
  const std::vector<std::int64_t> next = call(fed, 1, at, running, real, rng);
  StepOutput out;
  out.kind = StepOutput::Kind::kDecode;
  out.seconds = seconds_since(start);
  for (std::size_t b = 0; b < sequences; ++b) {
    if (!running[b]) continue;
    Slot& s = slots_[b];
    out.tokens.push_back(record(s, next[b]));
    ++out.computed_tokens;
    if (s.state == State::kRunning) ++s.position;  // a sequence that just stopped holds it
  }
  return out;
}

}  // namespace numesh::models
