// Engine's serving half: requests submitted, stepped as ragged batches over the paged caches,
// picked each by its own options and generator, and finished.

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <limits>
#include <string>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/timing.hpp"
#include "numesh/models/engine/engine.hpp"

namespace numesh::models {

namespace {

// The token count a step's program is compiled for: the next power of two, at most the step
// budget, so that a handful of programs serve every step.
std::int64_t token_bucket(std::int64_t tokens, std::int64_t budget) {
  return std::min(static_cast<std::int64_t>(std::bit_ceil(static_cast<std::uint64_t>(tokens))),
                  std::max(budget, tokens));
}

// Pads a step's tokens `ids` and `batch` to `tokens` with padding tokens: block 0 (which no
// sequence holds), position 0, one key, through a one-block table of their own.
void pad_step(std::vector<std::int32_t>& ids, ops::RaggedBatch& batch, std::int64_t tokens,
              std::int64_t block_size) {
  const auto table = static_cast<std::int64_t>(batch.tables.size());
  batch.tables.push_back(0);
  for (auto i = static_cast<std::int64_t>(ids.size()); i < tokens; ++i) {
    ids.push_back(0);
    batch.positions.push_back(0);
    batch.slots.push_back(i % block_size);
    batch.context.push_back(1);
    batch.table_of.push_back(table);
  }
}

}  // namespace

void Engine::compile_steps() {
  const SchedulerOptions& o = scheduler_->options();
  // A step of `tokens` padding tokens (block 0, position 0, one key) sampling `rows` copies of
  // its first row: the programs of that size, compiled.
  const auto run_padding = [&](std::int64_t tokens, std::int64_t rows) {
    ops::RaggedBatch batch;
    batch.max_context = o.max_context;
    std::vector<std::int32_t> ids;
    pad_step(ids, batch, tokens, o.block_size);
    const std::vector<std::int64_t> picked(static_cast<std::size_t>(rows), 0);
    (void)model_->ragged_candidates(ids, batch, picked, serving_->candidates);
    // And the head with log-sum-exps, for steps whose requests ask for log-probabilities.
    std::vector<double> log_normalizers;
    (void)model_->ragged_candidates(ids, batch, picked, serving_->candidates, &log_normalizers);
  };
  // Every size step() pads to: token counts by powers of two up to batch_tokens, sampled rows
  // by powers of two up to max_running (each bucket ends at its bound).
  for (std::int64_t t = 1;; t *= 2) {
    const std::int64_t tokens = std::min(t, o.batch_tokens);
    run_padding(token_bucket(tokens, o.batch_tokens), 1);
    if (tokens >= o.batch_tokens) break;
  }
  for (std::int64_t r = 2; r / 2 < o.max_running; r *= 2) {
    run_padding(1, token_bucket(std::min(r, o.max_running), o.max_running));
  }
  // The step's vectors, sized for the most a step can bring (batch_tokens tokens, a block table
  // for each of max_running sequences and the padding's, max_running rows padded to a power of
  // two): a step then only ever reuses their room.
  StepScratch& w = scratch_;
  const auto tokens = static_cast<std::size_t>(o.batch_tokens);
  const auto table = static_cast<std::size_t>(
      std::min((o.max_context + o.block_size - 1) / o.block_size, o.blocks - 1));
  const auto rows = std::bit_ceil(static_cast<std::size_t>(o.max_running));
  w.ids.reserve(tokens);
  for (std::vector<std::int64_t>* v :
       {&w.batch.positions, &w.batch.slots, &w.batch.context, &w.batch.table_of}) {
    v->reserve(tokens);
  }
  w.batch.tables.reserve(static_cast<std::size_t>(o.max_running) * table + 1);
  w.plan.chunks.reserve(static_cast<std::size_t>(o.max_running));
  w.rows.reserve(rows);
  w.head_rows.reserve(rows);
  w.sampled.reserve(rows);
  w.out.tokens.reserve(rows);
}

Scheduler& Engine::serving_scheduler(const char* call) const {
  NUMESH_CHECK(scheduler_ != nullptr, ValueError,
               "engine: {} needs an engine loaded with serving options", call);
  return *scheduler_;
}

const Scheduler& Engine::scheduler() const { return serving_scheduler("scheduler"); }

bool Engine::busy() const noexcept {
  return scheduler_ != nullptr && (scheduler_->waiting() > 0 || scheduler_->running() > 0);
}

std::optional<SequenceId> Engine::submit(std::vector<std::int32_t> prompt,
                                         const RequestOptions& options) {
  Scheduler& scheduler = serving_scheduler("submit");
  if (options.sampling) {
    ops::validate(*options.sampling);
    NUMESH_CHECK(options.sampling->top_k <= serving_->candidates, ValueError,
                 "submit: top_k {} is more than the {} candidates the engine brings back per "
                 "device",
                 options.sampling->top_k, serving_->candidates);
  }
  if (options.logprobs) {
    const std::int64_t most = std::min(kMaxTopLogprobs, serving_->candidates);
    NUMESH_CHECK(*options.logprobs >= 0 && *options.logprobs <= most, ValueError,
                 "submit: logprobs {} must be between 0 and {} (the engine brings back {} "
                 "candidates per device; OpenAI allows 20)",
                 *options.logprobs, most, serving_->candidates);
  }
  const std::int64_t vocab = config().vocab_size;
  for (std::size_t i = 0; i < prompt.size(); ++i) {
    const bool inside = prompt[i] >= 0 && prompt[i] < vocab;
    NUMESH_CHECK(inside, IndexError,
                 "submit: token {} at position {} is outside the model's vocabulary [0, {})",
                 prompt[i], i, vocab);
  }
  const std::optional<SequenceId> id = scheduler.add(std::move(prompt), options.max_new_tokens);
  if (id) requests_.emplace(*id, Request{.options = options, .rng = std::mt19937_64(options.seed)});
  return id;
}

void Engine::cancel(SequenceId sequence) {
  Scheduler& scheduler = serving_scheduler("cancel");
  if (!requests_.contains(sequence)) {
    throw KeyError(std::to_string(sequence),
                   fmt::format("cancel: no request {} (never submitted, or finished)", sequence));
  }
  scheduler.finish(sequence);
  requests_.erase(sequence);
}

TokenLogprobs Engine::score(const Request& request, std::span<const float> candidates,
                            double log_normalizer, std::int32_t picked) {
  // Every device's best, largest first and the lower id first among equals (the global order),
  // as log-probabilities.
  std::vector<std::pair<std::int32_t, double>> all;
  for (std::size_t i = 0; i + 1 < candidates.size(); i += 2) {
    all.emplace_back(static_cast<std::int32_t>(candidates[i + 1]),
                     static_cast<double>(candidates[i]) - log_normalizer);
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
  });
  TokenLogprobs out;
  // The picked token is among the candidates: greedy's best, or a draw from the top_k.
  for (const auto& [id, logprob] : all) {
    if (id == picked) out.logprob = logprob;
  }
  const auto n = static_cast<std::size_t>(
      std::min<std::int64_t>(*request.options.logprobs, static_cast<std::int64_t>(all.size())));
  out.top.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n));
  return out;
}

void Engine::pick_all(const ScheduledStep& plan, const runtime::HostTensor& candidates,
                      const std::vector<double>& log_normalizers,
                      std::vector<EngineStep::Token>& tokens) {
  Scheduler& scheduler = *scheduler_;
  const std::int64_t width = candidates.shape[1];
  std::vector<std::int32_t>& sampled = scratch_.sampled;
  sampled.clear();
  tokens.clear();
  for (const ScheduledChunk& c : plan.chunks) {
    if (!c.sample) continue;
    const std::size_t row = sampled.size();
    Request& request = requests_.at(c.sequence);
    const std::span<const float> row_candidates =
        std::span<const float>(candidates.data)
            .subspan(row * static_cast<std::size_t>(width), static_cast<std::size_t>(width));
    sampled.push_back(pick(request, row_candidates));
    tokens.push_back({.sequence = c.sequence,
                      .id = sampled.back(),
                      .stopped = std::nullopt,
                      .logprobs = request.options.logprobs
                                      ? std::optional(score(request, row_candidates,
                                                            log_normalizers[row], sampled.back()))
                                      : std::nullopt});
  }
  scheduler.complete(plan, sampled);
  for (EngineStep::Token& token : tokens) {
    const RequestOptions& o = requests_.at(token.sequence).options;
    if (std::find(o.stop_ids.begin(), o.stop_ids.end(), token.id) != o.stop_ids.end()) {
      token.stopped = StopReason::kStopId;
    } else if (scheduler.generated(token.sequence) >= o.max_new_tokens) {
      token.stopped = StopReason::kMaxNewTokens;
    }
    if (token.stopped) {
      scheduler.finish(token.sequence);
      requests_.erase(token.sequence);
    }
  }
}

std::int32_t Engine::pick(Request& request, std::span<const float> candidates) {
  // The row's candidates as the head's host halves take them: greedy's first best (the lowest
  // id among equals, a NaN first), or a draw with the request's own generator.
  const std::int64_t id =
      request.options.sampling
          ? scratch_.picker.sample(candidates, *request.options.sampling, request.rng)
          : ops::CandidatePicker::greedy(candidates);
  return static_cast<std::int32_t>(id);
}

const EngineStep& Engine::step() {
  Scheduler& scheduler = serving_scheduler("step");
  const auto start = std::chrono::steady_clock::now();
  StepScratch& w = scratch_;
  EngineStep& out = w.out;
  out.tokens.clear();
  out.prefill_tokens = out.decode_tokens = out.padded_tokens = 0;
  out.seconds = 0;
  scheduler.schedule(w.plan);
  if (w.plan.chunks.empty()) return out;
  const std::int64_t bs = scheduler.options().block_size;
  // The ragged batch: each chunk's tokens in order, each with its position, slot, context and
  // its sequence's block table; then padding up to the program's bucket.
  std::vector<std::int32_t>& ids = w.ids;
  ops::RaggedBatch& batch = w.batch;
  ids.clear();
  batch.positions.clear();
  batch.slots.clear();
  batch.context.clear();
  batch.table_of.clear();
  batch.tables.clear();
  batch.max_context = scheduler.options().max_context;
  w.rows.clear();
  for (const ScheduledChunk& c : w.plan.chunks) {
    const std::vector<std::int32_t>& tokens = scheduler.tokens(c.sequence);
    const std::span<const BlockId> table = scheduler.block_table(c.sequence);
    const auto table_at = static_cast<std::int64_t>(batch.tables.size());
    batch.tables.insert(batch.tables.end(), table.begin(), table.end());
    for (std::int64_t p = c.start; p < c.start + c.count; ++p) {
      ids.push_back(tokens[static_cast<std::size_t>(p)]);
      batch.positions.push_back(p);
      batch.slots.push_back(table[static_cast<std::size_t>(p / bs)] * bs + p % bs);
      batch.context.push_back(p + 1);
      batch.table_of.push_back(table_at);
    }
    if (c.sample) w.rows.push_back(static_cast<std::int64_t>(ids.size()) - 1);
    // A sequence that has generated feeds its last token (one a step); the others, prompts.
    (scheduler.generated(c.sequence) > 0 ? out.decode_tokens : out.prefill_tokens) += c.count;
  }
  const auto real = static_cast<std::int64_t>(ids.size());
  const std::int64_t padded = token_bucket(real, scheduler.options().batch_tokens);
  pad_step(ids, batch, padded, bs);
  out.padded_tokens = padded;
  // The picked rows, padded to a bucket too (copies of the first; their picks are dropped).
  std::vector<std::int64_t>& head_rows = w.head_rows;
  head_rows.assign(w.rows.begin(), w.rows.end());
  if (head_rows.empty()) head_rows.push_back(0);  // a step of prefill chunks only
  const std::int64_t head_bucket =
      token_bucket(static_cast<std::int64_t>(head_rows.size()), scheduler.options().max_running);
  head_rows.resize(static_cast<std::size_t>(head_bucket), head_rows.front());
  // Log-sum-exps only when a request of the step asks for log-probabilities (they read every
  // logit); each row's values are its own either way.
  const bool scored = std::any_of(w.plan.chunks.begin(), w.plan.chunks.end(), [&](const auto& c) {
    return c.sample && requests_.at(c.sequence).options.logprobs.has_value();
  });
  const runtime::HostTensor& candidates = model_->ragged_candidates(
      ids, batch, head_rows, serving_->candidates, scored ? &w.log_normalizers : nullptr);
  pick_all(w.plan, candidates, w.log_normalizers, out.tokens);
  out.seconds = seconds_since(start);
  return out;
}

}  // namespace numesh::models
