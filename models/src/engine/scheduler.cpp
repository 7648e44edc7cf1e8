#include "numesh/models/engine/scheduler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::models {

namespace {

std::int64_t blocks_for(std::int64_t tokens, std::int64_t block_size) {
  return (tokens + block_size - 1) / block_size;
}

}  // namespace

std::int64_t ScheduledStep::tokens() const noexcept {
  std::int64_t n = 0;
  for (const ScheduledChunk& c : chunks) n += c.count;
  return n;
}

std::int64_t ScheduledStep::samples() const noexcept {
  return std::count_if(chunks.begin(), chunks.end(),
                       [](const ScheduledChunk& c) { return c.sample; });
}

Scheduler::Scheduler(SchedulerOptions options)
    : options_(options), pool_(std::max<std::int64_t>(options.blocks, 2)) {
  NUMESH_CHECK(options.block_size >= 1, ValueError, "scheduler: block_size {} must be positive",
               options.block_size);
  NUMESH_CHECK(options.blocks >= 2, ValueError,
               "scheduler: {} blocks; the pool needs its scratch block and at least one more",
               options.blocks);
  NUMESH_CHECK(options.max_running >= 1, ValueError, "scheduler: max_running {} must be positive",
               options.max_running);
  NUMESH_CHECK(options.batch_tokens >= options.max_running, ValueError,
               "scheduler: batch_tokens {} must be at least max_running {} (every running "
               "sequence decodes in every step)",
               options.batch_tokens, options.max_running);
  NUMESH_CHECK(options.max_waiting >= 1, ValueError,
               "scheduler: max_waiting {} must be at least 1 (a request waits for its first "
               "step)",
               options.max_waiting);
  NUMESH_CHECK(options.max_context >= 1, ValueError, "scheduler: max_context {} must be positive",
               options.max_context);
}

const Scheduler::Sequence& Scheduler::at(SequenceId sequence, const char* call) const {
  const auto it = sequences_.find(sequence);
  if (it == sequences_.end()) {
    throw KeyError(std::to_string(sequence),
                   fmt::format("{}: no sequence {} (never added, or finished)", call, sequence));
  }
  return it->second;
}

std::optional<SequenceId> Scheduler::add(std::vector<std::int32_t> prompt,
                                         std::int64_t max_new_tokens) {
  NUMESH_CHECK(!prompt.empty(), ShapeError, "add: the prompt is empty");
  NUMESH_CHECK(max_new_tokens >= 1, ValueError, "add: max_new_tokens {} must be at least 1",
               max_new_tokens);
  // The last new token is not fed: the prompt and max_new_tokens - 1 generated tokens go in.
  const auto length = static_cast<std::int64_t>(prompt.size());
  const std::int64_t positions = length + max_new_tokens - 1;
  NUMESH_CHECK(positions <= options_.max_context, ValueError,
               "add: a prompt of {} tokens and {} new tokens take {} positions, past the {} a "
               "sequence may take",
               length, max_new_tokens, positions, options_.max_context);
  const std::int64_t reserved = blocks_for(positions, options_.block_size);
  NUMESH_CHECK(reserved <= pool_.blocks() - 1, ValueError,
               "add: a prompt of {} tokens and {} new tokens need {} blocks of {} tokens; the "
               "cache holds {}",
               length, max_new_tokens, reserved, options_.block_size, pool_.blocks() - 1);
  if (waiting() >= options_.max_waiting) return std::nullopt;
  const SequenceId id = next_id_++;
  Sequence s;
  s.tokens = std::move(prompt);
  // Room for every token and block it may take: decoding appends without allocating.
  s.tokens.reserve(static_cast<std::size_t>(length + max_new_tokens));
  s.blocks.reserve(static_cast<std::size_t>(reserved));
  s.prompt = length;
  s.max_new_tokens = max_new_tokens;
  s.reserved = reserved;
  sequences_.emplace(id, std::move(s));
  waiting_.push_back(id);
  return id;
}

std::int64_t Scheduler::outstanding() const {
  std::int64_t n = 0;
  for (const SequenceId id : running_) {
    const Sequence& s = sequences_.at(id);
    n += s.reserved - static_cast<std::int64_t>(s.blocks.size());
  }
  return n;
}

void Scheduler::start(SequenceId id, Sequence& s) {
  // The prompt's leading full blocks found in the cache, short of its last token, whose
  // logits must be computed to sample.
  if (options_.prefix_caching) {
    const std::int64_t bs = options_.block_size;
    const std::int64_t most = (static_cast<std::int64_t>(s.tokens.size()) - 1) / bs;
    BlockHash parent = 0;
    for (std::int64_t b = 0; b < most; ++b) {
      const BlockHash h =
          block_hash(parent, std::span<const std::int32_t>(s.tokens).subspan(
                                 static_cast<std::size_t>(b * bs), static_cast<std::size_t>(bs)));
      const std::optional<BlockId> hit = pool_.hit(h);
      if (!hit) break;
      s.blocks.push_back(*hit);
      parent = h;
    }
    s.published = static_cast<std::int64_t>(s.blocks.size());
    s.last_hash = parent;
    s.computed = s.published * bs;
    prefix_hit_tokens_ += s.computed;
  }
  s.running = true;
  running_.push_back(id);
}

void Scheduler::grow(Sequence& s, std::int64_t end) {
  const std::int64_t more =
      blocks_for(end, options_.block_size) - static_cast<std::int64_t>(s.blocks.size());
  if (more <= 0) return;
  // Admission reserved them (and the table's room): the pool cannot run short here.
  NUMESH_CHECK(pool_.allocate(more, s.blocks), Error,
               "scheduler: {} blocks reserved but not free (a bug in the reservation)", more);
}

ScheduledStep Scheduler::schedule() {
  ScheduledStep step;
  schedule(step);
  return step;
}

void Scheduler::schedule(ScheduledStep& step) {
  step.chunks.clear();
  std::int64_t budget = options_.batch_tokens;
  const auto take = [&](SequenceId id, Sequence& s, std::int64_t count) {
    const std::int64_t end = s.computed + count;
    grow(s, end);
    step.chunks.push_back({.sequence = id,
                           .start = s.computed,
                           .count = count,
                           .sample = end == static_cast<std::int64_t>(s.tokens.size())});
    budget -= count;
  };
  // Every decoding sequence's next token (max_running <= batch_tokens: they all fit); one
  // that has generated max_new_tokens is done and waits for finish().
  for (const SequenceId id : running_) {
    Sequence& s = sequences_.at(id);
    const bool done = static_cast<std::int64_t>(s.tokens.size()) - s.prompt >= s.max_new_tokens;
    if (!done && static_cast<std::int64_t>(s.tokens.size()) - s.computed == 1) take(id, s, 1);
  }
  // Then the prompts being prefilled, a chunk each while the budget lasts.
  for (const SequenceId id : running_) {
    Sequence& s = sequences_.at(id);
    const std::int64_t left = static_cast<std::int64_t>(s.tokens.size()) - s.computed;
    if (left > 1 && budget > 0) take(id, s, std::min(left, budget));
  }
  // Then waiting sequences, first come first started, while the budget, max_running and the
  // blocks allow (a head that does not fit holds the others back: no overtaking).
  while (!waiting_.empty() && budget > 0 && running() < options_.max_running) {
    const SequenceId id = waiting_.front();
    Sequence& s = sequences_.at(id);
    if (s.reserved > pool_.free_blocks() - outstanding()) break;
    waiting_.pop_front();
    start(id, s);
    const std::int64_t left = static_cast<std::int64_t>(s.tokens.size()) - s.computed;
    take(id, s, std::min(left, budget));
  }
}

void Scheduler::complete(const ScheduledStep& step, std::span<const std::int32_t> sampled) {
  NUMESH_CHECK(static_cast<std::int64_t>(sampled.size()) == step.samples(), ShapeError,
               "complete: {} sampled tokens for a step of {} sampling chunks", sampled.size(),
               step.samples());
  for (const ScheduledChunk& c : step.chunks) {
    const Sequence& s = at(c.sequence, "complete");
    NUMESH_CHECK(s.running && s.computed == c.start, ValueError,
                 "complete: sequence {} has {} tokens computed, the chunk starts at {}: not the "
                 "step schedule() gave last",
                 c.sequence, s.computed, c.start);
  }
  std::size_t next = 0;
  const std::int64_t bs = options_.block_size;
  for (const ScheduledChunk& c : step.chunks) {
    Sequence& s = sequences_.at(c.sequence);
    s.computed += c.count;
    if (c.sample) s.tokens.push_back(sampled[next++]);
    if (!options_.prefix_caching) continue;
    // The full blocks this chunk completed enter the prefix cache.
    for (; s.published < s.computed / bs; ++s.published) {
      const BlockHash h = block_hash(s.last_hash, std::span<const std::int32_t>(s.tokens).subspan(
                                                      static_cast<std::size_t>(s.published * bs),
                                                      static_cast<std::size_t>(bs)));
      pool_.publish(s.blocks[static_cast<std::size_t>(s.published)], h);
      s.last_hash = h;
    }
  }
}

void Scheduler::finish(SequenceId sequence) {
  const Sequence& s = at(sequence, "finish");
  pool_.release(s.blocks);
  if (s.running) {
    running_.erase(std::find(running_.begin(), running_.end(), sequence));
  } else {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), sequence));
  }
  sequences_.erase(sequence);
}

const std::vector<std::int32_t>& Scheduler::tokens(SequenceId sequence) const {
  return at(sequence, "tokens").tokens;
}

std::int64_t Scheduler::generated(SequenceId sequence) const {
  const Sequence& s = at(sequence, "generated");
  return static_cast<std::int64_t>(s.tokens.size()) - s.prompt;
}

std::int64_t Scheduler::computed(SequenceId sequence) const {
  return at(sequence, "computed").computed;
}

std::span<const BlockId> Scheduler::block_table(SequenceId sequence) const {
  return at(sequence, "block_table").blocks;
}

bool Scheduler::running(SequenceId sequence) const { return at(sequence, "running").running; }

}  // namespace numesh::models
