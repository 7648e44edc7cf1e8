#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "numesh/core/dtype.hpp"
#include "numesh/models/formats/checkpoint.hpp"
#include "numesh/models/hf/hf_config.hpp"
#include "numesh/models/hf/weight_formats.hpp"
#include "numesh/ops/embedding_config.hpp"
#include "numesh/ops/lm_head_config.hpp"
#include "numesh/ops/transformer_config.hpp"

// A Hugging Face checkpoint's tensors in numesh's layout: the token embedding as it is, every
// linear layer transposed (Hugging Face stores nn.Linear weights [out, in]; numesh multiplies
// x [rows, in] by w [in, out]), RMSNorm weights as [1, H] rows, experts stacked.

namespace numesh::models {

struct DeferredCausalLmWeights;

/// Where a large matrix's values are in a checkpoint: Hugging Face nn.Linear weights [out, in]
/// (one, or one per expert, stacked along a new first dim) transposed to numesh's [in, out], or,
/// when not `transposed`, one tensor as it is (the token embedding [V, H]).
struct MatrixSource {
  std::vector<std::string> tensors;
  bool transposed = true;
  /// The matrix is rows [row_offset, row_offset + rows) of each tensor, which has tensor_rows
  /// rows (a slice of a fused tensor: Phi-3's q in qkv_proj); tensor_rows 0: the whole tensor.
  std::int64_t row_offset = 0;
  std::int64_t rows = 0;
  std::int64_t tensor_rows = 0;
};

/// Checkpoint bytes read so far and in all, reported as a load goes (from one thread at a time).
using WeightsProgress = std::function<void(std::int64_t done, std::int64_t total)>;

/// A decoder-only language model's weights, in host memory, fp32 values (each layer's
/// stored_as says how the devices keep its matrices).
struct CausalLmWeights {
  ops::EmbeddingWeights embedding;  ///< model.embed_tokens.weight [V, H]
  ops::TransformerWeights stack;    ///< the blocks and model.norm
  ops::LmHeadWeights lm_head;  ///< lm_head.weight transposed [H, V], or the embedding's when tied

  /// Reads every tensor `config`'s architecture names (its ArchitectureSpec's table) from
  /// `checkpoint` (Llama's names:
  /// model.embed_tokens, model.layers.L.{input_layernorm, self_attn.{q,k,v,o}_proj,
  /// post_attention_layernorm, mlp.{gate,up,down}_proj}, model.norm, lm_head; the
  /// projections' biases (Qwen2, attention_bias, mlp_bias) and self_attn.{q,k}_norm (Qwen3);
  /// Mixtral's block_sparse_moe.{gate, experts.E.w1/w3/w2}; Qwen-MoE's mlp.{gate,
  /// experts.E.*_proj} and Qwen2-MoE's mlp.shared_expert.*_proj and mlp.shared_expert_gate),
  /// the dense MLP in Qwen-MoE's mlp_only_layers, checking each shape before reading it, and
  /// stores each matrix as `formats` says (embedding, LM head, attention, MLPs, experts and the
  /// shared expert, each matrix its own format; norms, biases, routers and the shared expert's
  /// gate stay fp32). A DType stores every matrix in it.
  /// `progress` (when set) is told the checkpoint bytes read so far and in all after each
  /// tensor (the stored bytes of every tensor the checkpoint holds: the last call may stay
  /// short of the total when it holds tensors the model does not read).
  /// Throws: ValueError as HfConfig::transformer_config(); KeyError naming the tensor,
  /// the checkpoint and its closest names when one is missing; ShapeError naming the tensor,
  /// its shape and the shape the config implies; ValueError for a dtype numesh cannot read.
  static CausalLmWeights load(const HfConfig& config, const Checkpoint& checkpoint,
                              const WeightFormats& formats = {},
                              const WeightsProgress& progress = {});
  /// As load(), with every large matrix (the embedding, the LM head, the attention, MLP, expert
  /// and shared-expert projections) left HostTensor::shape_only and its source recorded instead:
  /// what CausalLm::load reads straight into the devices. Shapes are checked as load() does;
  /// norms, biases and routers are read.
  /// Throws: as load().
  static DeferredCausalLmWeights deferred(const HfConfig& config, const Checkpoint& checkpoint,
                                          const WeightFormats& formats = {});
};

/// The Hugging Face tensor that a laid-out weight is saved as in `architecture` (the slot names
/// of ops::LmTrainingStep::parameters() and ops::ShardedTransformer::weights():
/// "embedding.table", "layers.L.attn_norm", "layers.L.attention.wq", ..., "final_norm",
/// "lm_head.weight"; names from the architecture's ArchitectureSpec: "model.embed_tokens.weight",
/// "model.layers.L.input_layernorm.weight", "model.layers.L.self_attn.q_proj.weight", ...).
/// Throws: KeyError naming the slot when the architecture has no such weight, or when it is a
/// stacked expert weight saved one tensor per expert (hf_tensor_parts() names those). A slice
/// of a fused tensor gets the fused tensor's name (Phi-3's wq: "...self_attn.qkv_proj.weight").
std::string hf_tensor_name(std::string_view slot, Architecture architecture);

/// One Hugging Face tensor holding (part of) a laid-out weight.
struct HfTensorPart {
  std::string name;          ///< the tensor's name in the checkpoint
  std::int64_t expert = -1;  ///< which expert of a stacked [E, ...] weight; -1: the whole weight
  bool transposed = false;  ///< saved as nn.Linear's [out, in], the transpose of numesh's [in, out]
  /// The rows of a fused tensor the weight is (Phi-3's q in qkv_proj: fused_rows() gives them
  /// for a config); kWhole: the tensor is the weight's alone.
  FusedPart fused = FusedPart::kWhole;
};

/// The Hugging Face tensors of a weight of slot `slot` in `architecture`, named by its
/// ArchitectureSpec: one for a slot saved as one tensor (hf_tensor_name()), as it is, except a
/// MoE block's "layers.L.moe.router" ([H, E]: Mixtral "block_sparse_moe.gate.weight", Qwen-MoE
/// "mlp.gate.weight") and Qwen2-MoE's "layers.L.moe.shared_expert_gate" ([H, 1]), transposed;
/// for the stacked experts "layers.L.moe.gate", ".up" and ".down" (stored out-in, [E, out, in])
/// one tensor per expert as it is (Mixtral "block_sparse_moe.experts.e.w1", "w3", "w2";
/// Qwen-MoE "mlp.experts.e.gate_proj", "up_proj", "down_proj"), `experts` of them; a slice of
/// a fused tensor (Phi-3's q, k, v, gate, up) its tensor and its FusedPart.
/// Throws: KeyError naming the slot when the architecture has no such weight.
std::vector<HfTensorPart> hf_tensor_parts(std::string_view slot, Architecture architecture,
                                          std::int64_t experts);

/// CausalLmWeights::deferred's result: the weights, and each shape-only matrix's source keyed
/// by its slot: "embedding.table", "lm_head.weight", and the names of
/// ops::ShardedTransformer::weights() ("layers.L.attention.wq", ...).
struct DeferredCausalLmWeights {
  CausalLmWeights weights;
  std::map<std::string, MatrixSource> sources;
};

}  // namespace numesh::models
