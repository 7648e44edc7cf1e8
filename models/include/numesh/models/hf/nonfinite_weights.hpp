#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "numesh/models/hf/hf_config.hpp"
#include "numesh/runtime/tensor.hpp"

// NaN and infinities in a model's weights, found where they are read: a checkpoint that holds
// them makes every output or loss that touches them non-finite, so numesh generate and numesh
// train say so (and refuse, with --refuse-nonfinite) before any work.

namespace numesh::models {

/// A laid-out weight to scan, by the name the user should see.
struct NamedTensor {
  std::string name;
  const runtime::ShardedTensor* tensor = nullptr;
};

/// A weight that holds NaN or infinities.
struct NonfiniteWeight {
  std::string name;
  std::int64_t count = 0;     ///< non-finite elements (each distinct shard counted once)
  std::int64_t elements = 0;  ///< elements of the weight
  float first = 0.0f;         ///< the first found (in the shards' order)
  std::string first_at;       ///< where, in the weight's coordinates as laid out: "[2, 5]"

  /// "layers.0.mlp.up holds 3 non-finite values of 4096 (the first, nan, at [2, 5])".
  [[nodiscard]] std::string describe() const;
};

/// The name a user knows a laid-out weight by: its Hugging Face tensor when it is saved as one
/// ("model.layers.0.self_attn.q_proj.weight"), else numesh's slot with the first of them
/// ("layers.0.moe.up (model.layers.0.block_sparse_moe.experts.0.w3.weight, ...)"), a slice of a
/// fused tensor its slot, its part and the tensor ("layers.3.attention.wv (v's rows of
/// model.layers.3.self_attn.qkv_proj.weight)": its positions count from the slice's rows), or
/// the slot alone when no Hugging Face name is known for it.
std::string weight_label(const std::string& slot, Architecture architecture, std::int64_t experts);

/// Scans every distinct shard (replica 0) of each weight, f32, bf16 or f16, for NaN and
/// infinities, each device its own shards on its own thread, all devices at once (16-bit values
/// by their exponent bits); returns those that hold any, in the order given, the first located
/// in the first shard that holds one. On a mesh over ranks each rank scans its own devices'
/// shards and every rank returns the same findings: a collective, called by every rank.
/// Throws: ValueError for a null tensor or another dtype; what the transport throws.
std::vector<NonfiniteWeight> find_nonfinite_weights(const std::vector<NamedTensor>& weights);

}  // namespace numesh::models
