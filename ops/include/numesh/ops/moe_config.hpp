#pragma once

#include <cstdint>
#include <vector>

#include "numesh/ops/mlp_config.hpp"
#include "numesh/runtime/tensor.hpp"

// What a mixture-of-experts layer is, independent of how it runs: its routing, its weights and
// the statistics of what the router did.

namespace numesh::ops {

/// A mixture-of-experts layer's routing.
struct MoeConfig {
  /// Number of experts E (>= 1).
  std::int64_t num_experts = 1;
  /// Experts per token k (1 <= k <= E).
  std::int64_t top_k = 1;
  /// Tokens each expert may take: ceil(capacity_factor * T * k / E); 0 means dropless (no
  /// limit). Assignments beyond an expert's capacity are dropped (they add nothing to the
  /// token's output), in GShard's priority order: every token's first choice before any
  /// second choice, tokens in order within a choice rank.
  float capacity_factor = 0.0f;
  /// Renormalise the k chosen probabilities to sum to 1 (Mixtral, Qwen-MoE); otherwise use
  /// the softmax probabilities as they are.
  bool renormalize = true;
};

/// Checks `c`: 1 <= top_k <= num_experts, capacity_factor finite and not negative.
/// Throws: ValueError naming the value ("moe: top_k 5 must be between 1 and the 4 experts",
/// "moe: capacity_factor -1 is negative", "moe: capacity_factor inf is not finite").
void check_moe_config(const MoeConfig& c);

/// The tokens each expert may take in a routing group of `rows` tokens: ceil(capacity_factor *
/// rows * top_k / E), or 0 when dropless (capacity_factor 0). A factor so large that the count
/// would not fit an int64 gives 2^62, which limits nothing. REQUIRES: check_moe_config(c).
[[nodiscard]] std::int64_t expert_capacity(const MoeConfig& c, std::int64_t rows);

/// The weights of a MoE layer with SwiGLU experts: router [H, E], and per expert e the slices
/// gate[e], up[e] ([H, F] each) and down[e] ([F, H]) of tensors [E, H, F] and [E, F, H].
/// Optionally Qwen2-MoE's shared expert: a SwiGLU MLP of its own size Fs that every token runs
/// beside its routed experts, gated per token:
///   y = routed(x) + sigmoid(x shared_expert_gate) * shared_expert(x).
struct MoeWeights {
  runtime::HostTensor router;  ///< [H, E]
  runtime::HostTensor gate;    ///< [E, H, F]
  runtime::HostTensor up;      ///< [E, H, F]
  runtime::HostTensor down;    ///< [E, F, H]
  /// The formats the layer stores the experts' gate, up and down in (as MlpWeights::stored_as;
  /// every expert alike); the router stays fp32, since routing decisions are where rounding
  /// would change the answer most.
  MlpFormats stored_as{};
  /// The shared expert: gate, up [H, Fs], down [Fs, H], stored as its own stored_as, no biases.
  /// Empty matrices: no shared expert. (Last, with braces: designated initializers may leave
  /// it out without GCC's warning.)
  MlpWeights shared_expert{};
  /// [H, 1] with a shared expert, else empty; fp32, as the router.
  runtime::HostTensor shared_expert_gate{};

  /// True when the layer has a shared expert.
  bool has_shared_expert() const noexcept { return !shared_expert.up.shape.empty(); }
};

/// Checks the shared expert of `w` against the hidden size: absent (every part empty), or gate
/// and up [H, Fs], down [Fs, H] with Fs > 0, shared_expert_gate [H, 1], and no biases.
/// Throws: ShapeError naming the parts and their shapes and what they must be.
void check_shared_expert(const MoeWeights& w, std::int64_t hidden);

/// What the router did.
struct MoeStats {
  /// Kept assignments per expert.
  std::vector<std::int64_t> tokens_per_expert;
  /// Assignments dropped for capacity (0 when dropless).
  std::int64_t dropped = 0;
  /// The capacity per expert (0 when dropless).
  std::int64_t capacity = 0;
};

}  // namespace numesh::ops
