#pragma once

#include <cstdint>
#include <vector>

#include "numesh/ops/tensor.hpp"
#include "numesh/runtime/tensor.hpp"

// Dense single-device references: the oracle every sharded operator is checked against, and
// themselves checked against PyTorch (tests/ops, docs/ops.md). Plain and serial on purpose,
// and independent of the code they judge: fp32 in and out, float64 arithmetic of their own
// inside (Eigen's double products, scalar erf/exp, their own RoPE, softmax and attention
// loops), rounded to fp32 once. None of the sharded path's kernels (gemm(), the vectorized
// activations, rope_inplace, attention_core) is called, so an error there cannot appear on
// both sides of a check.

namespace numesh::ops {

/// GELU, exact form: 0.5 * x * (1 + erf(x / sqrt(2))) (PyTorch's default, approximate='none'),
/// evaluated in float64 and rounded.
float gelu(float x) noexcept;
/// SiLU (swish): x * sigmoid(x), with the sigmoid evaluated without overflow for large |x|.
float silu(float x) noexcept;

/// y = gelu(x * w1) * w2. x: [T, H], w1: [H, F], w2: [F, H]; returns [T, H].
/// Throws: ShapeError naming the shapes when they do not chain.
RowMatrix mlp_gelu_reference(const RowMatrix& x, const RowMatrix& w1, const RowMatrix& w2);

/// SwiGLU MLP (LLaMA): y = (silu(x * w_gate) .* (x * w_up)) * w_down. x: [T, H],
/// w_gate and w_up: [H, F], w_down: [F, H]; returns [T, H].
/// Throws: ShapeError naming the shapes when they do not chain.
RowMatrix mlp_swiglu_reference(const RowMatrix& x, const RowMatrix& w_gate,
                               const RowMatrix& w_up, const RowMatrix& w_down);

/// RMSNorm: y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) .* weight.
/// x: [T, H], weight: [1, H] (a row). Throws: ShapeError when weight is not [1, H]; ValueError
/// when eps < 0.
RowMatrix rmsnorm_reference(const RowMatrix& x, const RowMatrix& weight, float eps = 1e-6f);

/// Shape of an attention computation. Layout bthd: q is [B, T, num_heads, head_dim], k and v
/// are [B, S, num_kv_heads, head_dim] (S keys, T queries).
struct AttentionConfig {
  /// Query heads.
  std::int64_t num_heads = 1;
  /// Key/value heads; must divide num_heads (GQA: query head h uses kv head
  /// h / (num_heads / num_kv_heads); MHA when equal).
  std::int64_t num_kv_heads = 1;
  /// Per-head dim; even when RoPE is applied.
  std::int64_t head_dim = 1;
  /// Causal mask: query t (at absolute position q_offset + t) sees keys 0..q_offset + t.
  bool causal = true;
  /// Absolute position of the first query: 0 for prefill/train, the cache length when decoding
  /// new tokens against a KV cache.
  std::int64_t q_offset = 0;
  /// Rotary position embedding applied to q (positions q_offset + t) and k (positions s),
  /// rotate-half form (LLaMA, Hugging Face): pairs (i, i + head_dim / 2), frequency
  /// theta^(-2i / head_dim). 0 disables RoPE.
  float rope_theta = 10000.0f;
};

/// Applies RoPE in place to x of shape [B, T, H, D] whose token t sits at position
/// first_position + t. Throws: ShapeError for a rank other than 4 or an odd D.
void apply_rope_reference(runtime::HostTensor& x, std::int64_t first_position, float theta);

/// softmax(q k^T / sqrt(head_dim) + mask) v per batch and head, the softmax in the stable form
/// (the row maximum subtracted first); RoPE first when config.rope_theta > 0.
/// Returns [B, T, num_heads, head_dim].
/// Throws: ShapeError naming the shapes when q, k, v disagree with each other or the config
/// (ranks, batch, heads, head_dim, k and v lengths), num_kv_heads does not divide num_heads,
/// or a causal query would see no key (S < q_offset + T).
runtime::HostTensor attention_reference(const runtime::HostTensor& q, const runtime::HostTensor& k,
                                        const runtime::HostTensor& v,
                                        const AttentionConfig& config);

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

/// MoE forward: probs = softmax(x router) (stable), the top_k experts per token (ties to
/// the lower expert index), their weights (renormalised if asked), capacity as in MoeConfig,
/// and y[t] = sum over kept choices j of weight_tj * swiglu_expert_{e_tj}(x[t]).
/// x: [T, H]; returns [T, H]; fills `stats` when given.
/// Throws: ValueError when top_k is not in [1, num_experts] (naming both) or capacity_factor
/// is negative; ShapeError naming the shapes when the weights do not fit x and the config.
RowMatrix moe_reference(const RowMatrix& x, const MoeWeights& weights, const MoeConfig& config,
                        MoeStats* stats = nullptr);

}  // namespace numesh::ops
