#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "numesh/models/lm/causal_lm.hpp"
#include "numesh/models/lm/generation.hpp"

// Generation as sequences that come and go: admit a prompt, step, read the tokens each step
// gave, retire the sequence. generate() is a loop over it; a server is another.
//
// This one runs over CausalLm's dense caches, one slot (batch row) per sequence, and batches
// statically: a step is either one prefill of every waiting prompt or one decode step of every
// running sequence, and prompts admitted while others decode wait until none does.

namespace numesh::models {

/// What one Generator::step did.
struct StepOutput {
  /// A prefill of the waiting prompts, or a decode step of the running sequences.
  enum class Kind { kPrefill, kDecode };
  /// One sequence's new token.
  struct Token {
    SequenceId sequence = 0;
    std::int64_t id = 0;
    /// Set when the sequence stopped with this token (it is counted in its ids).
    std::optional<StopReason> stopped{};
  };
  Kind kind = Kind::kDecode;
  /// Every sequence that took part, in admission order.
  std::vector<Token> tokens;
  /// Prompt tokens the step computed (a prefill; without the padding) or tokens it decoded.
  std::int64_t computed_tokens = 0;
  /// The model's call and the picks.
  double seconds = 0;
};

/// Sequences over one CausalLm: at most lm.batch() at once, each in a slot of its own from
/// admit() to retire(). Sampling draws from the generator step() is given, in slot order.
/// Not thread-safe: one thread drives an instance; the model must outlive it and not be called
/// by anything else meanwhile.
class Generator {
 public:
  /// Sequences run on `lm` (its caches are overwritten from the first step on).
  explicit Generator(CausalLm& lm);

  /// Admits `prompt` into a free slot to generate as `options` say; it is prefilled at the
  /// first step that finds no sequence decoding.
  /// Throws: ValueError when no slot is free (naming the slots), for max_new_tokens < 1 or bad
  /// sampling options; ShapeError for an empty prompt; IndexError for an id outside the
  /// model's vocabulary (naming it and its position) or a prompt and max_new_tokens that do
  /// not fit the model's positions (naming them).
  SequenceId admit(std::vector<std::int32_t> prompt, const GenerationOptions& options);

  /// One call of the model: the waiting prompts' prefill when no sequence decodes, else a
  /// decode step of every running sequence. A stopped sequence rides along until retired (its
  /// row computed and ignored, its position held), as does a free slot (a filler at position
  /// 0), so a step's program is compiled once per token count.
  /// Throws: ValueError when no sequence waits or runs (has_work()); what the model throws.
  StepOutput step(std::mt19937_64& rng);

  /// Frees the sequence's slot (running, waiting or stopped); its ids and logits go with it.
  /// Throws: KeyError for an id that is not admitted or already retired.
  void retire(SequenceId sequence);

  /// Whether a sequence waits for its prefill or is running.
  [[nodiscard]] bool has_work() const noexcept;
  /// Slots no sequence holds.
  [[nodiscard]] std::int64_t free_slots() const noexcept;
  /// The ids the sequence generated so far (its stop id included).
  /// Throws: KeyError as retire().
  [[nodiscard]] const std::vector<std::int64_t>& generated(SequenceId sequence) const;
  /// With options.keep_logits: the sequence's float32 logits so far, row-major [P + N - 1, V]
  /// (its prompt's positions, then each decode step's); otherwise empty.
  /// Throws: KeyError as retire().
  [[nodiscard]] const std::vector<float>& logits(SequenceId sequence) const;

 private:
  enum class State { kFree, kWaiting, kRunning, kStopped };
  struct Slot {
    State state = State::kFree;
    SequenceId id = -1;
    std::vector<std::int32_t> prompt;
    GenerationOptions options;
    std::vector<std::int64_t> generated;
    std::vector<float> logits;
    std::int64_t position = 0;  // where its next fed token goes
  };
  // The index of the sequence's slot. Throws: KeyError naming `call` and the id.
  std::size_t slot_of(SequenceId sequence, const char* call) const;
  StepOutput prefill(std::mt19937_64& rng);
  StepOutput decode(std::mt19937_64& rng);
  // Picks the next token of every slot in `taking_part` from one call of T tokens a slot.
  std::vector<std::int64_t> call(std::span<const std::int32_t> ids, std::int64_t tokens,
                                 const TokenPositions& at, const std::vector<bool>& taking_part,
                                 const std::vector<std::int64_t>& real, std::mt19937_64& rng);
  // Records `id` as the slot's next token and reports whether it stopped the sequence.
  StepOutput::Token record(Slot& slot, std::int64_t id);

  CausalLm* lm_;
  std::vector<Slot> slots_;
  SequenceId next_id_ = 0;
};

}  // namespace numesh::models
