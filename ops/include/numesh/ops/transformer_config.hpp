#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "numesh/ops/attention_config.hpp"
#include "numesh/ops/kernels/norms.hpp"
#include "numesh/ops/mlp_config.hpp"
#include "numesh/ops/moe_config.hpp"
#include "numesh/runtime/tensor.hpp"

// What a decoder-only transformer stack without embeddings is, independent of how it runs:
// blocks of
//   h = x + attention(rmsnorm(x));  x' = h + ffn(rmsnorm(h))
// where ffn is an MLP of mlp_kind (SwiGLU for every architecture numesh reads) or a MoE layer
// of SwiGLU experts (with, optionally, a gated shared expert), then a final RMSNorm. Its sizes
// and its weights.

namespace numesh::ops {

/// The most layers a TransformerConfig may have (validate() refuses more): far above any model
/// (the largest have about 130), low enough that walking the layers is instant.
inline constexpr std::int64_t kMaxLayers = std::int64_t{1} << 16;

/// Sizes of a transformer stack. Every field has a default (a small model).
struct TransformerConfig {
  std::int64_t hidden = 256;
  std::int64_t layers = 2;
  /// Heads, kv heads, head_dim and RoPE; q_offset must stay 0 (positions come per run).
  AttentionConfig attention{.num_heads = 8, .num_kv_heads = 4, .head_dim = 32};
  /// Intermediate size of the dense MLPs.
  std::int64_t ffn = 512;
  /// The dense layers' MLP (kGelu: no gate matrix). MoE layers' experts and shared expert are
  /// SwiGLU only: validate() refuses another kind when the stack has a MoE layer.
  MlpKind mlp_kind = MlpKind::kSwiGLU;
  /// Routing of the MoE layers.
  MoeConfig moe{.num_experts = 8, .top_k = 2};
  /// Intermediate size of each expert.
  std::int64_t moe_ffn = 256;
  /// Layer i (0-based) is a MoE layer when moe_every > 0, (i + 1) % moe_every == 0 and i is
  /// not in dense_layers; 0 = no MoE layers.
  std::int64_t moe_every = 2;
  /// RMSNorm epsilon.
  float norm_eps = 1e-6f;
  /// Added to the blocks' and the final RMSNorm's weights as they scale (Gemma: 1, its norms
  /// multiplying by 1 + w); 0 for the other architectures. The attention's q/k norms take none.
  float norm_weight_offset = 0.0f;
  /// Intermediate size of the MoE layers' shared expert (Qwen2-MoE); 0 = none.
  std::int64_t shared_expert_ffn = 0;
  /// Layers whose feed-forward is the dense MLP though moe_every makes them MoE
  /// (Qwen-MoE's mlp_only_layers): distinct, in [0, layers). (Last, with braces: designated
  /// initializers may leave it out without GCC's warning.)
  std::vector<std::int64_t> dense_layers{};

  /// True when layer i's feed-forward is a MoE layer.
  bool is_moe(std::int64_t layer) const noexcept {
    return moe_every > 0 && (layer + 1) % moe_every == 0 &&
           std::find(dense_layers.begin(), dense_layers.end(), layer) == dense_layers.end();
  }
  /// The block norms' and the final norm's constants (norm_eps, norm_weight_offset).
  RmsNormConstants norm_constants() const noexcept {
    return {.eps = norm_eps, .weight_offset = norm_weight_offset};
  }
  /// Throws: ValueError naming the offending sizes (non-positive sizes, num_kv_heads not
  /// dividing num_heads, top_k outside [1, experts], odd head_dim with RoPE, a negative
  /// shared_expert_ffn), a dense layer outside [0, layers) or listed twice, or an invalid RoPE
  /// scaling field; NotImplementedError naming mlp_kind when it is not SwiGLU and a layer is
  /// MoE (the experts' kernels are SwiGLU).
  void validate() const;
  /// Parameters (weights) of the whole stack; optional biases left out.
  std::int64_t parameters() const noexcept;
  /// FLOPs of one forward of `batch` sequences of `tokens` new tokens at `position` (the work
  /// done, multiply-add = 2): attention (attention_flops), the dense MLPs, and for MoE layers
  /// the router plus top_k experts per token (dropless) plus the shared expert and its gate;
  /// norms, biases and residual adds left out.
  double flops(std::int64_t batch, std::int64_t tokens, std::int64_t position) const noexcept;
};

/// One block's weights.
struct BlockWeights {
  runtime::HostTensor attn_norm;  ///< [1, H]
  AttentionWeights attention;
  runtime::HostTensor ffn_norm;  ///< [1, H]
  MlpWeights mlp;                ///< of mlp_kind (biases optional), dense blocks only
  MoeWeights moe;                ///< MoE blocks only; its shared expert when shared_expert_ffn > 0
};

/// A whole stack's weights.
struct TransformerWeights {
  std::vector<BlockWeights> blocks;
  runtime::HostTensor final_norm;  ///< [1, H]; empty (no shape): no final norm (a bare block)

  /// Random weights for `config`: normal(0, 1/sqrt(fan_in)) matrices, norms around 1, from a
  /// seeded generator (the same seed gives the same weights everywhere); no biases; no MLP
  /// gate when mlp_kind is kGelu.
  [[nodiscard]] static TransformerWeights random(const TransformerConfig& config,
                                                 std::uint32_t seed);
  /// Stores every block's attention, MLP, expert and shared-expert matrices as `dtype` (norms,
  /// biases, routers and shared-expert gates stay fp32): sets each layer's stored_as.
  void store_as(DType dtype);
};

}  // namespace numesh::ops
