#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "numesh/models/lm/causal_lm.hpp"
#include "numesh/ops/lowering/lm_head.hpp"

// Text generation over a CausalLm: a batch of prompts of different lengths prefilled in one
// call (padded at their end to the longest), then decoded together, each sequence at its own
// position, each stopping on its own.

namespace numesh::models {

/// A sequence's handle in a Generator or a Scheduler, unique over its owner's life.
using SequenceId = std::int64_t;

/// How generate() picks and stops.
struct GenerationOptions {
  /// Tokens each sequence generates at most (>= 1).
  std::int64_t max_new_tokens = 32;
  /// A sequence stops after generating one of these (the model's eos ids; empty: never).
  std::vector<std::int64_t> stop_ids{};
  /// Empty: greedy (argmax). Otherwise sample as these say (ShardedLmHead::sample).
  std::optional<ops::SamplingOptions> sampling{};
  /// Bring every position's whole logits to the host (GenerationResult::logits) and pick from
  /// them with the same rules (every token a candidate); otherwise only each sequence's pick
  /// (greedy) or its top-k candidates (sampling) leave the devices.
  bool keep_logits = false;
};

/// Why a sequence stopped.
enum class StopReason { kStopId, kMaxNewTokens };

/// What generate() made, per sequence in the prompts' order.
struct GenerationResult {
  std::vector<std::vector<std::int64_t>>
      ids;                          ///< each sequence's generated ids (its stop id included)
  std::vector<StopReason> stopped;  ///< why each stopped
  /// With keep_logits: sequence b's float32 logits, row-major [P_b + N_b - 1, V]: its prompt's
  /// positions, then each decode step's (P_b prompt tokens, N_b generated).
  std::vector<std::vector<float>> logits;
  double prefill_seconds = 0;     ///< the prompts' call (all sequences at once)
  double decode_seconds = 0;      ///< the decode steps
  std::int64_t decode_steps = 0;  ///< calls after the prefill (each one token per running sequence)
  std::int64_t decoded_tokens = 0;  ///< tokens those steps generated, over the sequences
};

/// Generates from `prompts` (one per sequence of `lm`, each at least one token) as `options`
/// say: one prefill of all the prompts (the shorter padded at their end with their own last
/// token; see ShardedTransformer::forward for why the padding changes nothing; the stack run in
/// chunks of at most lm.prefill_chunk() tokens), then decode
/// steps of one token per sequence at each sequence's own position until every sequence has
/// stopped. A stopped sequence rides along (its row is computed and ignored, its position
/// held) so the others keep one compiled program. `on_tokens(step, tokens)`, when given, sees
/// each call's new token of every sequence (-1 for a sequence that had already stopped), step 0
/// being the prefill's. Sampling draws from `rng`, sequence by sequence in order.
/// The caches are written from position 0: a second call starts the sequences afresh.
/// Throws: ShapeError when the prompts do not number lm.batch() or one is empty; ValueError for
/// max_new_tokens < 1 or bad sampling options; IndexError when the longest prompt plus
/// max_new_tokens exceeds lm.max_len() (naming them) or an id is outside the vocabulary; what
/// the model throws.
GenerationResult generate(
    CausalLm& lm, const std::vector<std::vector<std::int32_t>>& prompts,
    const GenerationOptions& options, std::mt19937_64& rng,
    const std::function<void(std::int64_t, std::span<const std::int64_t>)>& on_tokens = {});

/// "stop id" or "max new tokens".
const char* to_string(StopReason reason) noexcept;

}  // namespace numesh::models
