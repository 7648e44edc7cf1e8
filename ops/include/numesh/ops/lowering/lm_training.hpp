#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "numesh/ops/eigen_views.hpp"
#include "numesh/ops/embedding_config.hpp"
#include "numesh/ops/lm_head_config.hpp"
#include "numesh/ops/lowering/model_axes.hpp"
#include "numesh/ops/lowering/program.hpp"
#include "numesh/ops/matmul_precision.hpp"
#include "numesh/ops/transformer_config.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/tensor.hpp"

// A decoder-only language model's training step on a device mesh, one program: the token
// embedding, the transformer blocks, the final norm and the LM head's vocabulary-parallel
// cross-entropy, then every operator's backward in reverse order, leaving each parameter's
// gradient laid out like the parameter (gradients.hpp). The update (clip, AdamW) runs on those
// gradients afterwards (optimizer.hpp).

namespace numesh::ops {

/// A parameter being trained: its name, its fp32 values on the mesh, its gradient (laid out
/// alike, overwritten by every step) and how its matrix is stored.
struct TrainableParameter {
  /// "embedding.table", ShardedTransformer::weights()' names ("layers.L.attention.wq", ...,
  /// "layers.L.mlp.down" or, in a MoE block, "layers.L.moe.router", ".moe.gate", ".moe.up",
  /// ".moe.down" as MoeWeights holds them, with a shared expert ".moe.shared_expert.gate",
  /// ".up", ".down" (stored out-in) and ".moe.shared_expert_gate" [H, 1], "final_norm"), then
  /// "lm_head.weight" (absent when the head is tied to the embedding).
  std::string name;
  std::shared_ptr<runtime::ShardedTensor> value;
  std::shared_ptr<runtime::ShardedTensor> grad;
  WeightLayout layout = WeightLayout::kInOut;  ///< kOutIn: a matrix stored [out, in]
};

/// One program computing, for `batch` sequences of `tokens` inputs and their targets, the
/// mean cross-entropy over all batch x tokens positions and every parameter's gradient of it.
/// Activations [batch, tokens, H] are split over the batch axes (sequences) and the sequence
/// axis (tokens, sequence parallel); the embedding and the head see the same devices' tokens
/// as rows [batch x tokens, H] (a per-device copy joins the two views). Attention's heads and
/// the MLP's intermediate dim are split over their tensor axes, the MLP's weights over
/// ModelAxes::weights (ZeRO-3), the vocabulary over the heads' axis. With a tied head, the LM
/// head multiplies by the embedding's table and both gradients are summed into one.
/// `router_aux_loss_coef` > 0 adds coef x the router's load-balancing loss of all MoE layers
/// together to the loss (transformers' output_router_logits with router_aux_loss_coef; off at
/// 0, the default): each MoE layer's choice counts and probability sums are summed over the
/// mesh (one all-reduce of 2E values after the forward) and every router's backward adds the
/// loss's gradient (RouterAuxGradient).
/// `precision` kBF16 runs every product of activations and weights (the projections, the MLP
/// and experts, the LM head, forward and backward, weight gradients included) in bf16 compute
/// on the fp32 master weights, rounding both operands as the kernels pack them; attention's
/// scores, the router, norms, softmax, the loss and the gradients' sums stay fp32
/// (MatmulPrecision).
/// Not thread-safe: one thread drives an instance.
class LmTrainingStep {
 public:
  /// Lays out the weights (fp32: training's master weights) and compiles the program.
  /// `head` null: the head is tied to the embedding.
  /// MoE blocks route each device's tokens as one group (MoeAxes); their experts split over
  /// ModelAxes::expert and expert_tensor, the tokens gathered over those, or, when the batch
  /// axes include the expert axis, sent to their experts and back by all-to-all (GShard).
  /// Throws: ValueError as TransformerConfig::validate, when a weight is not stored fp32 or
  /// router_aux_loss_coef is negative or not finite; ShapeError naming the sizes when batch or
  /// tokens is not positive, batch is not a multiple of the batch axes' size, tokens not a multiple
  /// of the sequence axis' size, the weights do not fit the config or there is no final norm; what
  /// the layers' layouts throw.
  LmTrainingStep(runtime::DeviceMesh mesh, TransformerConfig config,
                 const EmbeddingWeights& embedding, const TransformerWeights& stack,
                 const LmHeadWeights* head, std::int64_t batch, std::int64_t tokens,
                 ModelAxes axes = {}, MatmulPrecision precision = MatmulPrecision::kF32,
                 double router_aux_loss_coef = 0.0);
  ~LmTrainingStep();
  LmTrainingStep(LmTrainingStep&&) noexcept;
  LmTrainingStep& operator=(LmTrainingStep&&) noexcept;

  /// Runs the forward and backward for inputs[b * tokens + t] predicting targets[b * tokens +
  /// t]; overwrites every gradient and returns the loss: the mean cross-entropy (summed in
  /// double) plus coef x the router's load-balancing loss when that is on.
  /// Throws: ShapeError when inputs or targets do not hold batch x tokens ids; IndexError
  /// naming the sequence, position and id of the first id outside the vocabulary (before
  /// anything runs); what a node throws.
  double run(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets);

  /// The parameters in a fixed order (TrainableParameter::name).
  const std::vector<TrainableParameter>& parameters() const noexcept { return parameters_; }
  /// The compiled program (its plan: tensors, collectives, FLOPs, memory).
  Program& program() noexcept { return *program_; }
  /// The config.
  const TransformerConfig& config() const noexcept { return config_; }
  /// The mesh the step runs on.
  const runtime::DeviceMesh& mesh() const noexcept { return mesh_; }
  /// Sequences per step.
  std::int64_t batch() const noexcept { return batch_; }
  /// Input tokens per sequence.
  std::int64_t tokens() const noexcept { return tokens_; }
  /// The precision of the step's products.
  MatmulPrecision precision() const noexcept { return precision_; }
  /// The last run's router load-balancing loss (before its coefficient; 0 when it is off).
  double router_aux_loss() const noexcept { return router_aux_loss_; }
  /// The vocabulary size.
  std::int64_t vocab() const noexcept { return vocab_; }

 private:
  struct Layers;
  void compile();

  runtime::DeviceMesh mesh_;
  TransformerConfig config_;
  ModelAxes axes_;
  std::int64_t batch_, tokens_, vocab_ = 0;
  MatmulPrecision precision_;
  double router_aux_loss_coef_ = 0.0, router_aux_loss_ = 0.0;
  // Rows the router loss' counts count (every MoE layer's, one device per token group); 0: off.
  std::int64_t router_aux_rows_ = 0;
  std::unique_ptr<Layers> layers_;
  std::vector<TrainableParameter> parameters_;
  // Row r of the embedding's and the head's [batch x tokens] rows holds the caller's id at
  // position_of_row_[r] (of its row-major [batch, tokens]): each device's rows are its tile of
  // the activations in the tile's order, so both views put the same tokens on the same device.
  std::vector<std::int64_t> position_of_row_;
  std::vector<std::int32_t> inputs_, targets_;  // in row order; read by the program's nodes
  std::unique_ptr<Program> program_;
};

}  // namespace numesh::ops
