#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "numesh/models/engine/block_pool.hpp"
#include "numesh/models/lm/generation.hpp"

// Continuous batching: which tokens of which sequences each step computes. A step is one
// ragged batch: the next token of every running sequence that decodes, then chunks of prompts
// still being prefilled, then the first chunks of waiting prompts, under a token budget, so a
// long prompt never stalls the running streams for more than one chunk. Sequences hold KV
// blocks from a BlockPool, growing block by block; a prompt's leading full blocks already in
// the cache are reused (prefix caching).
//
// Admission reserves: a waiting sequence starts only when the free blocks cover, beside what
// the running sequences may still take, every block it can come to hold (its prompt and
// max_new_tokens - 1 generated tokens). So a running sequence never lacks a block and is never
// preempted: its tokens do not depend on what else runs (see docs/serving.md). The scheduler
// plans and books; it runs nothing, and stopping is its owner's call (finish()).

namespace numesh::models {

/// How a Scheduler forms steps.
struct SchedulerOptions {
  /// Tokens per KV block.
  std::int64_t block_size = 16;
  /// Blocks of the pool, its scratch block included (BlockPool).
  std::int64_t blocks = 0;
  /// Tokens a step computes at most (at least max_running: every running sequence decodes in
  /// every step).
  std::int64_t batch_tokens = 512;
  /// Sequences running at once.
  std::int64_t max_running = 16;
  /// Sequences waiting at most (>= 1: a request waits for its first step); add() refuses more.
  std::int64_t max_waiting = 64;
  /// Positions a sequence may take: its prompt and max_new_tokens - 1 generated tokens.
  std::int64_t max_context = 2048;
  /// Reuse the cached full blocks a prompt starts with.
  bool prefix_caching = true;
};

/// One sequence's share of a step: its tokens [start, start + count) are computed (their keys
/// and values written to its blocks); with `sample`, the last one's logits pick its next token.
struct ScheduledChunk {
  SequenceId sequence = 0;
  std::int64_t start = 0;
  std::int64_t count = 0;
  bool sample = false;
};

/// What one step computes: decodes first, then prefill chunks (Scheduler::schedule).
struct ScheduledStep {
  std::vector<ScheduledChunk> chunks;
  /// Tokens over all chunks (at most SchedulerOptions::batch_tokens).
  [[nodiscard]] std::int64_t tokens() const noexcept;
  /// Chunks that sample: one new token each.
  [[nodiscard]] std::int64_t samples() const noexcept;
};

/// Sequences waiting and running, their tokens, their blocks, and the steps over them.
/// Not thread-safe: the engine's thread owns it.
class Scheduler {
 public:
  /// Throws: ValueError naming an option out of range (block_size, blocks, max_running,
  /// batch_tokens below max_running, max_waiting, max_context).
  explicit Scheduler(SchedulerOptions options);

  /// Queues a sequence that generates at most `max_new_tokens` after `prompt`. nullopt when
  /// max_waiting sequences already wait (the caller says "busy": nothing is queued).
  /// Throws: ShapeError for an empty prompt; ValueError for max_new_tokens < 1, or a prompt
  /// and max_new_tokens past max_context or past what the whole pool holds (naming them).
  [[nodiscard]] std::optional<SequenceId> add(std::vector<std::int32_t> prompt,
                                              std::int64_t max_new_tokens);

  /// The next step: one token of every decoding sequence, then a prefill chunk of each
  /// sequence still prefilling, then the first chunks of waiting sequences (first come, first
  /// started) while the budget, max_running and the blocks allow; running sequences in the
  /// order they started. Books the blocks the chunks write to. A sequence that has generated
  /// max_new_tokens is not stepped again (its owner finishes it). Empty when nothing can run.
  [[nodiscard]] ScheduledStep schedule();
  /// schedule() into `step` (cleared first): a step reused from call to call allocates nothing
  /// once its chunks have room for max_running of them.
  void schedule(ScheduledStep& step);

  /// Records that `step` (the last schedule()) ran: each chunk's tokens are computed, the
  /// full blocks they completed enter the prefix cache, and each sampling chunk's sequence
  /// takes its token from `sampled` (one per sampling chunk, in order).
  /// Throws: ShapeError when sampled does not hold step.samples() tokens; KeyError for a
  /// sequence finished since. Nothing is recorded then.
  void complete(const ScheduledStep& step, std::span<const std::int32_t> sampled);

  /// Ends a sequence, waiting or running (it stopped, or its client left): its blocks go back
  /// to the pool at once, its prefix staying cached.
  /// Throws: KeyError for a sequence not added or already finished.
  void finish(SequenceId sequence);

  /// The sequence's tokens: its prompt, then what it generated.
  /// Throws: KeyError as finish().
  [[nodiscard]] const std::vector<std::int32_t>& tokens(SequenceId sequence) const;
  /// Tokens it generated.
  [[nodiscard]] std::int64_t generated(SequenceId sequence) const;
  /// Its tokens whose keys and values are in its blocks.
  [[nodiscard]] std::int64_t computed(SequenceId sequence) const;
  /// Its blocks, in token order (block i holds tokens [i * block_size, (i + 1) * block_size)).
  [[nodiscard]] std::span<const BlockId> block_table(SequenceId sequence) const;
  /// Whether it runs (else it waits).
  [[nodiscard]] bool running(SequenceId sequence) const;

  /// Sequences waiting, and running.
  [[nodiscard]] std::int64_t waiting() const noexcept {
    return static_cast<std::int64_t>(waiting_.size());
  }
  [[nodiscard]] std::int64_t running() const noexcept {
    return static_cast<std::int64_t>(running_.size());
  }
  /// Prompt tokens whose blocks came from the prefix cache, over all sequences so far.
  [[nodiscard]] std::int64_t prefix_hit_tokens() const noexcept { return prefix_hit_tokens_; }
  /// The blocks.
  [[nodiscard]] const BlockPool& pool() const noexcept { return pool_; }
  /// The options.
  [[nodiscard]] const SchedulerOptions& options() const noexcept { return options_; }

 private:
  struct Sequence {
    std::vector<std::int32_t> tokens;
    std::int64_t prompt = 0;  // prompt tokens
    std::int64_t max_new_tokens = 0;
    std::int64_t computed = 0;
    std::int64_t reserved = 0;   // blocks it may come to hold
    std::int64_t published = 0;  // leading full blocks entered in the prefix cache
    BlockHash last_hash = 0;     // the hash of its last published block
    std::vector<BlockId> blocks;
    bool running = false;
  };
  const Sequence& at(SequenceId sequence, const char* call) const;
  // Blocks the running sequences may still take.
  std::int64_t outstanding() const;
  // Starts the sequence: its cached leading blocks taken, what it needs reserved.
  void start(SequenceId id, Sequence& s);
  // Holds the blocks tokens [0, end) of `s` write to.
  void grow(Sequence& s, std::int64_t end);

  SchedulerOptions options_;
  BlockPool pool_;
  std::map<SequenceId, Sequence> sequences_;
  std::deque<SequenceId> waiting_;
  std::vector<SequenceId> running_;  // in the order they started
  SequenceId next_id_ = 0;
  std::int64_t prefix_hit_tokens_ = 0;
};

}  // namespace numesh::models
