#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "numesh/ops/attention.hpp"
#include "numesh/ops/mlp.hpp"
#include "numesh/ops/moe.hpp"
#include "numesh/ops/program.hpp"
#include "numesh/ops/reference.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/sharding/partition_manager.hpp"

// A decoder-only transformer stack without embeddings: blocks of
//   h = x + attention(rmsnorm(x));  x' = h + ffn(rmsnorm(h))
// where ffn is a SwiGLU MLP or a MoE layer, then a final RMSNorm. The unit `numesh run`
// compiles and checks against the dense reference below.

namespace numesh::ops {

/// Sizes of a transformer stack. Every field has a default (a small model).
struct TransformerConfig {
  std::int64_t hidden = 256;
  std::int64_t layers = 2;
  /// Heads, kv heads, head_dim and RoPE; q_offset must stay 0 (positions come per run).
  AttentionConfig attention{.num_heads = 8, .num_kv_heads = 4, .head_dim = 32};
  /// Intermediate size of the dense SwiGLU MLPs.
  std::int64_t ffn = 512;
  /// Routing of the MoE layers.
  MoeConfig moe{.num_experts = 8, .top_k = 2};
  /// Intermediate size of each expert.
  std::int64_t moe_ffn = 256;
  /// Layer i (0-based) is a MoE layer when moe_every > 0 and (i + 1) % moe_every == 0; 0 = no
  /// MoE layers.
  std::int64_t moe_every = 2;
  /// RMSNorm epsilon.
  float norm_eps = 1e-6f;

  /// True when layer i's feed-forward is a MoE layer.
  bool is_moe(std::int64_t layer) const noexcept { return moe_every > 0 && (layer + 1) % moe_every == 0; }
  /// Throws: ValueError naming the offending sizes (non-positive sizes, num_kv_heads not
  /// dividing num_heads, top_k outside [1, experts], odd head_dim with RoPE).
  void validate() const;
  /// Parameters (weights) of the whole stack.
  std::int64_t parameters() const noexcept;
  /// FLOPs of one forward of `batch` sequences of `tokens` new tokens at `position` (the work
  /// done, multiply-add = 2): attention (attention_flops), the SwiGLU MLPs, and for MoE layers
  /// the router plus top_k experts per token (dropless); norms and residual adds left out.
  double flops(std::int64_t batch, std::int64_t tokens, std::int64_t position) const noexcept;
};

/// One block's weights.
struct BlockWeights {
  runtime::HostTensor attn_norm;  ///< [1, H]
  AttentionWeights attention;
  runtime::HostTensor ffn_norm;   ///< [1, H]
  MlpWeights mlp;                 ///< SwiGLU, dense blocks only
  MoeWeights moe;                 ///< MoE blocks only
};

/// A whole stack's weights.
struct TransformerWeights {
  std::vector<BlockWeights> blocks;
  runtime::HostTensor final_norm;  ///< [1, H]; empty (no shape): no final norm (a bare block)

  /// Random weights for `config`: normal(0, 1/sqrt(fan_in)) matrices, norms around 1, from a
  /// seeded generator (the same seed gives the same weights everywhere).
  [[nodiscard]] static TransformerWeights random(const TransformerConfig& config, std::uint32_t seed);
};

/// The mesh axes a model's lowering uses, resolved from eformer's semantic axes.
struct ModelAxes {
  std::vector<std::string> batch = {"dp", "fsdp"};  ///< sequences (BATCH)
  std::string heads = "tp";                         ///< attention heads (HEAD)
  std::string mlp = "tp";                           ///< MLP intermediate (MLP_INTERMEDIATE)
  std::string expert = "ep";                        ///< experts (EXPERT)
  std::string expert_tensor = "tp";                 ///< each expert's F (TENSOR_PARALLEL)
  std::string sequence = "sp";                      ///< tokens (QUERY_LENGTH): sequence parallel
  /// Axes splitting the MLP weights' H dim (FSDP / ZeRO-3, EasyDeL's ColumnWise dim 0): stored
  /// split, all-gathered every run. Attention and expert weights are not split this way yet.
  std::vector<std::string> weights = {};

  /// Resolves BATCH, HEAD, MLP_INTERMEDIATE, EXPERT, TENSOR_PARALLEL and QUERY_LENGTH with
  /// `pm` in `mode`, and `weights` from the ColumnWise preset's dim 0. Throws: ValueError naming the token when HEAD, MLP_INTERMEDIATE, EXPERT
  /// or TENSOR_PARALLEL resolves to more than one mesh axis (numesh splits those dims over
  /// one axis); what PartitionManager::resolve throws.
  [[nodiscard]] static ModelAxes resolve(const sharding::PartitionManager& pm, sharding::Mode mode);
  /// As above for eformer's mode argument on the model's activations [batch, T, hidden]. A
  /// named mode resolves as above. An integer mode (ModeArg::from_dim) is inferred per call as
  /// EasyDeL's get_mode does: decode when the dim's extent is 1, else train. When the dim is T
  /// (1 or -2) a model sees both (prefill calls and decode steps) but lays its weights and
  /// caches out once, so train and decode must resolve every axis alike; the sequence axis is
  /// train's (a one-token call never splits T).
  /// Throws: as above; IndexError when the dim is outside [-3, 3); ValueError naming each
  /// field whose axes differ between train and decode.
  [[nodiscard]] static ModelAxes resolve(const sharding::PartitionManager& pm, sharding::ModeArg mode,
                                         std::int64_t batch, std::int64_t hidden);
};

/// The dense single-device transformer with its own KV caches: the oracle of
/// ShardedTransformer, in float64 arithmetic of its own (ops/src/oracle.hpp) rounded to fp32
/// once per call. forward(x, position) as ShardedTransformer::forward. MoE capacity is decided
/// within routing groups as the sharded model's devices decide it: `batch_groups` consecutive
/// blocks of sequences times, when a call's T divides by it, `sequence_groups` consecutive
/// blocks of tokens; dropless routing does not depend on them. Callers derive the group counts
/// from the mesh and the axes (not from the model under test).
class TransformerReference {
 public:
  /// Throws: as TransformerConfig::validate; ShapeError when batch or max_len is not positive,
  /// the batch groups do not divide the batch, or the weights do not fit the config.
  TransformerReference(TransformerConfig config, TransformerWeights weights, std::int64_t batch,
                       std::int64_t max_len, std::int64_t batch_groups = 1, std::int64_t sequence_groups = 1);
  ~TransformerReference();
  TransformerReference(TransformerReference&&) noexcept;
  TransformerReference& operator=(TransformerReference&&) noexcept;
  /// y = model(x) for x [batch, T, H] at positions [position, position + T), using and
  /// updating the caches. Throws: ShapeError / IndexError as ShardedTransformer::forward.
  runtime::HostTensor forward(const runtime::HostTensor& x, std::int64_t position);

 private:
  struct Caches;  // per layer float64 keys and values [batch * max_len, kv_heads * head_dim]
  TransformerConfig config_;
  TransformerWeights weights_;
  std::int64_t batch_, max_len_, batch_groups_, sequence_groups_;
  std::unique_ptr<Caches> caches_;
};

/// A transformer stack lowered onto a device mesh: every layer's weights laid out once, one
/// KV cache per layer (bthd or bhtd), and one program per distinct token count T, compiled on
/// first use (prefill, insert chunks, decode steps), all sharing the weights and caches.
/// Activations [B, T, H] are split over the batch axes and, when T divides, the sequence axis
/// (sequence parallel: attention gathers keys and values over it; decode steps, T = 1, are
/// replicated over it), and replicated elsewhere; RMSNorms and residual adds run per device on
/// its rows; attention, MLP and MoE emit their collectives.
/// Not thread-safe: one thread drives an instance.
class ShardedTransformer {
 public:
  /// Throws: as TransformerConfig::validate and the layers' create functions; ShapeError when
  /// batch or max_len is not positive.
  ShardedTransformer(runtime::DeviceMesh mesh, TransformerConfig config, const TransformerWeights& weights,
                     std::int64_t batch, std::int64_t max_len, ModelAxes axes = {},
                     KvLayout layout = KvLayout::kBTHD);
  ~ShardedTransformer();
  ShardedTransformer(ShardedTransformer&&) noexcept;
  ShardedTransformer& operator=(ShardedTransformer&&) noexcept;

  /// y = model(x) for x [batch, T, H] whose tokens sit at positions [position, position + T);
  /// their keys and values are written into the caches at those positions.
  /// Throws: ShapeError for an x of another batch or hidden size; IndexError when the tokens
  /// do not fit the caches (naming position, T and max_len); what a node throws.
  runtime::HostTensor forward(const runtime::HostTensor& x, std::int64_t position);
  /// Compiles (if needed) and returns the program for T new tokens.
  Program& program(std::int64_t tokens);
  /// The MoE layers' routing statistics of the last run, summed over layers (empty without
  /// MoE layers).
  MoeStats moe_stats() const;
  /// Routing groups of the MoE layers along the sequences (the activations' batch splits).
  std::int64_t routing_groups() const noexcept;
  /// Routing groups along the tokens of a call whose T divides by it (the sequence axes'
  /// size; 1 without sequence parallelism).
  std::int64_t sequence_groups() const noexcept;
  /// The activations' spec (after correction) for T tokens.
  sharding::PartitionSpec activation_spec(std::int64_t tokens) const;
  /// Bytes a decode step reads per device at `position`: local weights plus the KV caches'
  /// valid part.
  std::int64_t decode_bytes_per_device(std::int64_t position) const;
  /// The config.
  const TransformerConfig& config() const noexcept { return config_; }

 private:
  struct Layer;
  struct Compiled;
  Compiled& compiled_for(std::int64_t tokens);
  runtime::DeviceMesh mesh_;
  TransformerConfig config_;
  ModelAxes axes_;
  std::int64_t batch_, max_len_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::shared_ptr<runtime::ShardedTensor> final_norm_;
  std::int64_t position_ = 0;  // read by the programs' nodes when they run
  std::vector<std::unique_ptr<Compiled>> programs_;
  Compiled* last_ = nullptr;
};

}  // namespace numesh::ops
