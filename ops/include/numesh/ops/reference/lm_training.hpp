#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>

#include "numesh/ops/embedding_config.hpp"
#include "numesh/ops/lm_head_config.hpp"
#include "numesh/ops/transformer_config.hpp"
#include "numesh/runtime/tensor.hpp"

// The dense oracle of LmTrainingStep: a decoder-only language model's mean cross-entropy and
// every parameter's gradient, composed from the operators' float64 references and their
// backward references (reference/backward.hpp, each checked against PyTorch's autograd),
// with fp32 values between operators.

namespace numesh::ops {

/// The loss and the gradients, keyed by LmTrainingStep's parameter names, each shaped as the
/// weight structs hold the weight ([in, out] matrices, [1, H] norms, the table [V, H], the
/// head [H, V]); no "lm_head.weight" when tied (its gradient is added into the table's).
struct LmTrainingGrads {
  double loss = 0.0;             ///< the mean cross-entropy plus coef x router_aux_loss
  double router_aux_loss = 0.0;  ///< router_aux_loss() of the MoE layers (0 without the term)
  std::map<std::string, runtime::HostTensor> grads;
};

/// inputs and targets hold batch x tokens ids (row-major [batch, tokens]); `head` null: tied.
/// A MoE block routes all batch x tokens rows as one group: what LmTrainingStep computes on
/// any mesh when the layer is dropless (with a capacity, the step routes each device's tokens
/// as a group of their own).
/// `router_aux_loss_coef` > 0 (with MoE layers) adds coef x the router's load-balancing loss
/// of every MoE layer together (router_aux_loss: transformers' output_router_logits) to the
/// loss, and its gradient to the routers'.
/// The attention's biases and q/k norms (Qwen2, Qwen3), where present, are parameters too:
/// "layers.L.attention.bq", ".bk", ".bv", ".bo", ".q_norm", ".k_norm", as rows [1, n].
/// So are the MLP's biases (Llama's mlp_bias): "layers.L.mlp.gate_bias", ".up_bias", ".down_bias".
/// The dense MLPs are config.mlp_kind's: a GELU MLP has no "layers.L.mlp.gate".
/// So are a shared expert's matrices ("layers.L.moe.shared_expert.gate", ".up", ".down", [in,
/// out] as MoeWeights holds them) and its gate ("layers.L.moe.shared_expert_gate", [H, 1]).
/// Throws: ShapeError when the ids or
/// the weights do not fit; IndexError for an id outside the vocabulary; ValueError for a
/// negative router_aux_loss_coef; what config.validate() throws.
LmTrainingGrads lm_training_reference(const TransformerConfig& config,
                                      const EmbeddingWeights& embedding,
                                      const TransformerWeights& stack, const LmHeadWeights* head,
                                      std::span<const std::int32_t> inputs,
                                      std::span<const std::int32_t> targets, std::int64_t batch,
                                      std::int64_t tokens, double router_aux_loss_coef = 0.0);

}  // namespace numesh::ops
