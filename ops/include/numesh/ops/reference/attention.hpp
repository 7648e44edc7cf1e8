#pragma once

#include <cstdint>

#include "numesh/ops/attention_config.hpp"
#include "numesh/runtime/tensor.hpp"

// The attention references (see reference/mlp.hpp for what the references are).

namespace numesh::ops {

/// Applies RoPE in place to x of shape [B, T, H, D] whose token t sits at position
/// first_position + t, frequencies scaled by `scaling`.
/// Throws: ShapeError for a rank other than 4 or an odd D; ValueError for an invalid scaling
/// (validate()).
void apply_rope_reference(runtime::HostTensor& x, std::int64_t first_position, float theta,
                          const RopeScaling& scaling = {});

/// softmax(q k^T / sqrt(head_dim) + mask) v per batch and head, the softmax in the stable form
/// (the row maximum subtracted first); RoPE first when config.rope_theta > 0.
/// Returns [B, T, num_heads, head_dim].
/// Throws: ShapeError naming the shapes when q, k, v disagree with each other or the config
/// (ranks, batch, heads, head_dim, k and v lengths), num_kv_heads does not divide num_heads,
/// or a causal query would see no key (S < q_offset + T); ValueError for an invalid
/// config.rope_scaling.
runtime::HostTensor attention_reference(const runtime::HostTensor& q, const runtime::HostTensor& k,
                                        const runtime::HostTensor& v,
                                        const AttentionConfig& config);

/// The dense attention layer, the oracle of ShardedAttention (float64 arithmetic of its own,
/// rounded once): q, k, v = x wq, x wk, x wv; attention_reference (causal from position 0,
/// RoPE per config); times wo. x is [B, T, H]; returns [B, T, H].
/// Throws: ShapeError naming the shapes when x and the weights do not fit the config.
runtime::HostTensor attention_layer_reference(const runtime::HostTensor& x,
                                              const AttentionWeights& weights,
                                              const AttentionConfig& config);

}  // namespace numesh::ops
