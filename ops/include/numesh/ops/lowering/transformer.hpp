#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "numesh/ops/lowering/attention.hpp"
#include "numesh/ops/lowering/mlp.hpp"
#include "numesh/ops/lowering/model_axes.hpp"
#include "numesh/ops/lowering/moe.hpp"
#include "numesh/ops/lowering/program.hpp"
#include "numesh/ops/transformer_config.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/sharding/partition_manager.hpp"

// The transformer stack of transformer_config.hpp lowered onto a device mesh: the unit
// `numesh run` compiles and checks against TransformerReference (reference/transformer.hpp).

namespace numesh::ops {

/// The paged KV caches of a ShardedTransformer that runs ragged steps (forward_ragged).
struct PagedCacheOptions {
  /// Blocks per layer's cache, block 0 (the padding's) included.
  std::int64_t blocks = 0;
  /// Positions per block.
  std::int64_t block_size = 16;
  /// The most positions a sequence may take (scratch sizes).
  std::int64_t max_context = 0;
  /// The most sequences a step holds (their block tables are what a step brings); 0: as many
  /// as its tokens.
  std::int64_t max_sequences = 0;
  /// How the caches store keys and values: f32, or bf16 / f16 in half the bytes
  /// (KvCache::create).
  DType kv_dtype = DType::kF32;
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
  /// The caches store keys and values as `kv_dtype` (f32, or bf16 / f16: KvCache::create).
  /// Throws: as TransformerConfig::validate and the layers' create functions; ShapeError when
  /// batch or max_len is not positive, or a MoE block's shared expert is not the config's
  /// (shared_expert_ffn; 0: none); as KvCache::create for kv_dtype.
  ShardedTransformer(runtime::DeviceMesh mesh, TransformerConfig config,
                     const TransformerWeights& weights, std::int64_t batch, std::int64_t max_len,
                     ModelAxes axes = {}, KvLayout layout = KvLayout::kBTHD,
                     DType kv_dtype = DType::kF32);
  /// The same stack with paged caches, for ragged steps only (forward_ragged): every layer's
  /// keys and values in `paged.blocks` blocks of `paged.block_size` positions, kv heads split
  /// like wk. The tokens of a step are whole on every device (the batch and sequence axes do
  /// not split them; heads, MLP and experts split as usual).
  /// Throws: as the constructor above; ShapeError when the paged options are out of range.
  ShardedTransformer(runtime::DeviceMesh mesh, TransformerConfig config,
                     const TransformerWeights& weights, const PagedCacheOptions& paged,
                     ModelAxes axes = {});
  ~ShardedTransformer();
  ShardedTransformer(ShardedTransformer&&) noexcept;
  ShardedTransformer& operator=(ShardedTransformer&&) noexcept;

  /// y = model(x) for x [batch, T, H] whose tokens sit at positions [position, position + T);
  /// their keys and values are written into the caches at those positions.
  /// Throws: ShapeError for an x of another batch or hidden size; IndexError when the tokens
  /// do not fit the caches (naming position, T and max_len); what a node throws.
  runtime::HostTensor forward(const runtime::HostTensor& x, std::int64_t position);
  /// As forward(x, position), with sequence b's tokens at positions [positions[b],
  /// positions[b] + T): sequences of different lengths decode together. A batch of prompts of
  /// different lengths is prefilled padded at its end to the longest: a padding token's keys
  /// and values land past its sequence's end, where the sequence's next token overwrites them
  /// before any query sees them (causal attention looks back only), so the padding changes no
  /// real token's output.
  /// Throws: as forward(x, position); ShapeError when positions does not hold one entry per
  /// sequence; IndexError naming the first sequence whose tokens do not fit the caches.
  runtime::HostTensor forward(const runtime::HostTensor& x,
                              std::span<const std::int64_t> positions);
  /// The check forward(x, positions) makes before it runs: that `tokens` new tokens of every
  /// sequence b at positions[b] fit the caches (for callers that split a call into several).
  /// Throws: ShapeError when positions does not hold one entry per sequence; IndexError naming
  /// the first sequence whose tokens do not fit.
  void check_fits(std::int64_t tokens, std::span<const std::int64_t> positions) const;
  /// y = model(x) for the N tokens x [1, N, H] of a ragged step laid out by `batch` (each token
  /// at its own sequence's position, its key and value written into its slot, attending through
  /// its sequence's block table). A program per N, compiled on first use: callers pad N to a
  /// few sizes (padding tokens write to block 0 and see one key; see RaggedBatch).
  /// Throws: ValueError when the stack was not built with paged caches; ShapeError for an x not
  /// [1, N, H], or a batch of other sizes or another max_context; IndexError naming a token whose
  /// slot, context or block table does not fit the caches; what a node throws.
  /// Returns the program's output [1, N, H], valid until the next call (copy it to keep it).
  const runtime::HostTensor& forward_ragged(const runtime::HostTensor& x, const RaggedBatch& batch);
  /// Programs compiled so far (one per token count used).
  std::int64_t compiled_programs() const noexcept {
    return static_cast<std::int64_t>(programs_.size());
  }
  /// Whether the stack keeps paged caches (ragged steps) rather than dense ones.
  bool paged() const noexcept { return paged_.blocks > 0; }
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

  /// A laid-out weight and where it sits in the stack.
  struct NamedWeight {
    std::string name;
    std::shared_ptr<runtime::ShardedTensor> tensor;
    WeightLayout layout = WeightLayout::kInOut;  ///< kOutIn: a matrix stored [out, in]
  };
  /// Every laid-out weight, in layer order: "layers.L.attn_norm", "layers.L.attention.{wq, wk,
  /// wv, wo}" (stored out-in) and, where the model has them, "layers.L.attention.{bq, bk, bv,
  /// bo, q_norm, k_norm}" (rows [1, n]), "layers.L.ffn_norm", then "layers.L.mlp.{gate, up, down}"
  /// (out-in) with "layers.L.mlp.{gate_bias, up_bias, down_bias}" where it has them, or
  /// "layers.L.moe.{router, gate, up, down}" (experts stacked [E, in, out]) with, for a shared
  /// expert, "layers.L.moe.shared_expert.{gate, up, down}" and "layers.L.moe.shared_expert_gate"
  /// ([H, 1]), and "final_norm".
  /// Weights given HostTensor::shape_only are laid out unfilled: their owner fills them through
  /// these (runtime::fill_shards) before the first run.
  std::vector<NamedWeight> weights() const;

 private:
  struct Layer;
  using Programs = ProgramCache<std::vector<MoeRouting*>>;  // extra: each MoE layer's routing
  Programs::Entry& compiled_for(std::int64_t tokens);
  Program compile(std::int64_t tokens, std::vector<MoeRouting*>& routings);
  // Lays out the weights of every layer (the caches come after, dense or paged).
  void lay_out(const TransformerWeights& weights);
  runtime::DeviceMesh mesh_;
  TransformerConfig config_;
  ModelAxes axes_;
  std::int64_t batch_, max_len_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::shared_ptr<runtime::ShardedTensor> final_norm_;
  std::vector<std::int64_t>
      positions_;            // each sequence's; read by the programs' nodes when they run
  PagedCacheOptions paged_;  // blocks 0: dense caches
  RaggedBatch ragged_;       // a ragged step's tokens; read by the programs' nodes
  Programs programs_;
  Programs::Entry* last_ = nullptr;
};

}  // namespace numesh::ops
