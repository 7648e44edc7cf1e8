#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "numesh/ops/attention_config.hpp"
#include "numesh/ops/mlp_config.hpp"
#include "numesh/ops/moe_config.hpp"
#include "numesh/runtime/tensor.hpp"

// The gradients of the dense references: what every sharded backward pass is checked against
// (see reference/mlp.hpp for what the references are). float64 inside, written on their own
// from the chain rule (no code shared with the forward kernels), fp32 out; checked against
// PyTorch's autograd in float64 (ops_backward_matches_pytorch). Matrices are row-major
// [rows, cols]; every weight is fp32.

namespace numesh::ops {

/// Gradients of y = rmsnorm(x) .* weight (x [rows, H], weight [1, H]) given dy [rows, H].
struct RmsNormGrads {
  runtime::HostTensor dx;       ///< [rows, H]
  runtime::HostTensor dweight;  ///< [1, H]
};
/// Throws: ShapeError when the shapes do not fit; ValueError for a negative eps.
RmsNormGrads rmsnorm_backward(const runtime::HostTensor& x, const runtime::HostTensor& weight,
                              const runtime::HostTensor& dy, double eps);

/// Gradients of y = layernorm(x) .* weight + bias (x [rows, H], weight and bias [1, H]; the
/// biased variance, as torch.nn.LayerNorm) given dy [rows, H].
struct LayerNormGrads {
  runtime::HostTensor dx;       ///< [rows, H]
  runtime::HostTensor dweight;  ///< [1, H]
  runtime::HostTensor dbias;    ///< [1, H]: dy summed over the rows
};
/// Throws: ShapeError when the shapes do not fit; ValueError for a negative eps.
LayerNormGrads layernorm_backward(const runtime::HostTensor& x, const runtime::HostTensor& weight,
                                  const runtime::HostTensor& dy, double eps);

/// Gradients of y = x w (x [rows, in], w [in, out]) given dy [rows, out].
struct LinearGrads {
  runtime::HostTensor dx;  ///< [rows, in] = dy w^T
  runtime::HostTensor dw;  ///< [in, out] = x^T dy
};
/// Throws: ShapeError when the shapes do not chain.
LinearGrads linear_backward(const runtime::HostTensor& x, const runtime::HostTensor& w,
                            const runtime::HostTensor& dy);

/// Gradients of an MLP (no biases, fp32 weights) given dy [rows, H].
struct MlpGrads {
  runtime::HostTensor dx;     ///< [rows, H]
  runtime::HostTensor dgate;  ///< [H, F] (empty without a gate)
  runtime::HostTensor dup;    ///< [H, F]
  runtime::HostTensor ddown;  ///< [F, H]
  /// The biases' gradients (Llama's mlp_bias), shaped as MlpWeights holds them; empty where
  /// the layer has none.
  runtime::HostTensor dgate_bias, dup_bias, ddown_bias;
};
/// The MLP of `kind`: y = act(x w_up + b_up) w_down + b_down, or, gated (SwiGLU), y =
/// (act(x w_gate + b_gate) .* (x w_up + b_up)) w_down + b_down (each bias optional; w.gate
/// unused without a gate).
/// Throws: ShapeError when the weights or biases do not fit x; NotImplementedError for weights
/// not stored as f32 (not yet differentiated).
MlpGrads mlp_backward(const runtime::HostTensor& x, MlpKind kind, const MlpWeights& w,
                      const runtime::HostTensor& dy);

/// Gradients of the attention layer y = attention_layer_reference(x, w, c) (causal from
/// position 0, RoPE per config, GQA) given dy [B, T, H]; the weights as AttentionWeights holds
/// them ([in, out]).
struct AttentionGrads {
  runtime::HostTensor dx;   ///< [B, T, H]
  runtime::HostTensor dwq;  ///< [H, num_heads * head_dim]
  runtime::HostTensor dwk;  ///< [H, num_kv_heads * head_dim]
  runtime::HostTensor dwv;  ///< likewise
  runtime::HostTensor dwo;  ///< [num_heads * head_dim, H]
  /// Each present when the layer has it (shaped as AttentionWeights holds it), else empty:
  /// the biases' (Qwen2's q, k, v; attention_bias' o) and Qwen3's q/k norms' gradients, the
  /// norms' summed over every head.
  runtime::HostTensor dbq, dbk, dbv, dbo, dq_norm, dk_norm;
};
/// With q/k norms, each head's q and k (after their biases) are RMS-normalised before RoPE,
/// as attention_layer_reference does.
/// Throws: ShapeError as attention_layer_reference; NotImplementedError for weights not stored
/// as f32 (not yet differentiated).
AttentionGrads attention_layer_backward(const runtime::HostTensor& x, const AttentionWeights& w,
                                        const AttentionConfig& c, const runtime::HostTensor& dy);

/// The gradient of the embedding table [V, H] for rows x[r] = table[ids[r]] given dy [rows, H]:
/// each row of dy added to its token's row (repeated tokens accumulate).
/// Throws: ShapeError when dy has not ids.size() rows; IndexError for an id outside [0, V).
runtime::HostTensor embedding_backward(std::span<const std::int32_t> ids, std::int64_t vocab,
                                       const runtime::HostTensor& dy);

/// The LM head with the mean cross-entropy of the logits x w against `targets`, and its
/// gradients: loss = mean over rows r of (logsumexp(l_r) - l_r[targets[r]]), l = x w.
struct CrossEntropyGrads {
  double loss = 0.0;
  runtime::HostTensor dx;  ///< [rows, H]
  runtime::HostTensor dw;  ///< [H, V]
};
/// x [rows, H], w [H, V], one target per row.
/// Throws: ShapeError when the shapes do not fit or there are no rows; IndexError for a target
/// outside [0, V).
CrossEntropyGrads lm_head_cross_entropy(const runtime::HostTensor& x, const runtime::HostTensor& w,
                                        std::span<const std::int32_t> targets);

/// Gradients of the MoE layer y = moe_reference(x, w, c) (SwiGLU experts) given dy [T, H]. The
/// routing decisions (top-k, capacity) are piecewise constant: the gradient flows through each
/// kept choice's expert and its routing weight (the softmax, and the renormalisation when
/// asked); a dropped choice passes none. A shared expert (Qwen2-MoE: y += sigmoid(x g) S(x))
/// sees dy scaled by its gate, and its gate's logit sigmoid'(x g) (dy . S(x)). Weights as
/// MoeWeights holds them.
struct MoeGrads {
  runtime::HostTensor dx;       ///< [T, H]
  runtime::HostTensor drouter;  ///< [H, E]
  runtime::HostTensor dgate;    ///< [E, H, F]
  runtime::HostTensor dup;      ///< [E, H, F]
  runtime::HostTensor ddown;    ///< [E, F, H]
  /// The shared expert's gate, up [H, Fs] and down [Fs, H] and its gate's [H, 1]; empty
  /// without a shared expert.
  runtime::HostTensor dshared_gate, dshared_up, dshared_down, dshared_expert_gate;
};
/// `dprobs`: when given (E values), a gradient added to every token's router probabilities
/// before the softmax's backward (router_aux_loss's, scaled by its coefficient).
/// Throws: ValueError for top_k outside [1, E] or a negative capacity_factor; ShapeError when
/// the weights do not fit x or dprobs is neither empty nor E values, or the shared expert does
/// not fit (check_shared_expert); NotImplementedError for experts not stored as f32 (not yet
/// differentiated).
MoeGrads moe_backward(const runtime::HostTensor& x, const MoeWeights& w, const MoeConfig& c,
                      const runtime::HostTensor& dy, std::span<const double> dprobs = {});

/// The router's auxiliary load-balancing loss of several MoE layers together, as transformers'
/// load_balancing_loss_func computes it from their router logits concatenated (Mixtral,
/// Qwen-MoE; no attention mask): over all N = layers x tokens routed rows,
///   loss = E sum_e (C_e / N) (S_e / N),
/// C_e the number of top-k choices of expert e (capacity ignored) and S_e the sum of the
/// softmax probabilities of e. The choices are constants, so d loss / d p[t, e] = E C_e / N^2
/// for every row t of every layer: `dprobs`.
struct RouterAuxLoss {
  double loss = 0.0;
  std::vector<double> dprobs;  ///< [E]
};
/// `xs[l]` [T, H] are layer l's router inputs and `routers[l]` [H, E] its router.
/// Throws: ValueError when there is no layer or the lists differ in length; ShapeError when a
/// router does not fit its x or config.
RouterAuxLoss router_aux_loss(const std::vector<runtime::HostTensor>& xs,
                              const std::vector<runtime::HostTensor>& routers, const MoeConfig& c);

}  // namespace numesh::ops
