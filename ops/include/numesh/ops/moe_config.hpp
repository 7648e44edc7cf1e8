#pragma once

#include <cstdint>
#include <vector>

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

/// The weights of a MoE layer with SwiGLU experts: router [H, E], and per expert e the slices
/// gate[e], up[e] ([H, F] each) and down[e] ([F, H]) of tensors [E, H, F] and [E, F, H].
struct MoeWeights {
  runtime::HostTensor router;  ///< [H, E]
  runtime::HostTensor gate;    ///< [E, H, F]
  runtime::HostTensor up;      ///< [E, H, F]
  runtime::HostTensor down;    ///< [E, F, H]
  /// The dtype the layer stores the experts in (as MlpWeights::stored_as); the router stays
  /// fp32, since routing decisions are where rounding would change the answer most.
  DType stored_as = DType::kF32;
};

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
