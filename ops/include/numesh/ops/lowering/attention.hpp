#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "numesh/ops/attention_config.hpp"
#include "numesh/ops/kernels/attention_core.hpp"
#include "numesh/ops/lowering/program.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/graph.hpp"
#include "numesh/runtime/tensor.hpp"

namespace numesh::ops {

/// Mesh axes of the attention layer. Every field has a default.
struct AttentionAxes {
  /// Sequences (dim B of x) split over these axes; replicated when B does not divide.
  std::vector<std::string> batch = {"dp", "fsdp"};
  /// Tokens (dim T of x) split over these axes (sequence parallelism): each device projects
  /// its tokens, keys and values are all-gathered over these axes, and each device attends
  /// for its own queries. Replicated when T does not divide (a decode step's T = 1).
  std::vector<std::string> sequence = {};
  /// Heads split over this axis: wq, wk, wv column-parallel by whole heads, wo row-parallel,
  /// and the output's partial sums all-reduced over it. Query heads are split when num_heads
  /// divides; kv heads too when num_kv_heads divides as well (else each device computes all kv
  /// heads); nothing is split otherwise.
  std::string heads = "tp";
};

/// An attention layer's weights laid out on a mesh (heads split at head granularity, see
/// AttentionAxes), shared by every program that runs the layer.
struct AttentionLayer {
  AttentionConfig config;
  std::int64_t hidden = 0;
  std::string heads_axis;  ///< the axis splitting heads; empty when none does
  std::int64_t local_q_heads = 0;
  std::int64_t local_kv_heads = 0;
  /// The projections, stored out-in (wq [Q, H], wk and wv [KV, H], wo [H, Q];
  /// WeightLayout::kOutIn).
  std::shared_ptr<runtime::ShardedTensor> wq, wk, wv, wo;
  /// The optional biases and q/k norm weights (AttentionWeights), fp32 rows [1, n] laid out as
  /// the projections they follow: bq split like wq's heads, bk and bv like wk's, bo, q_norm and
  /// k_norm [1, head_dim] replicated. Null when absent. Trainable parameters like the others.
  std::shared_ptr<runtime::ShardedTensor> bq, bk, bv, bo, q_norm, k_norm;

  /// True when query heads are split over heads_axis.
  bool splits_heads() const noexcept { return !heads_axis.empty(); }
  /// True when kv heads are split too.
  bool splits_kv_heads() const noexcept {
    return splits_heads() && local_kv_heads < config.num_kv_heads;
  }

  /// What mesh slot `slot` attends over for an input x [B, T, H] laid out as x is: its
  /// sequences and tokens (queries), all T keys, and its query and kv heads.
  AttentionSlice slice(const runtime::ShardedTensor& x, std::int64_t slot) const;

  /// Validates and lays out the weights.
  /// Throws: ShapeError naming the shapes when the weights do not fit the config, or head_dim
  /// is odd with RoPE on; ValueError when num_kv_heads does not divide num_heads or
  /// config.q_offset is not 0 (positions are given per run).
  [[nodiscard]] static AttentionLayer create(const runtime::DeviceMesh& mesh,
                                             const AttentionConfig& config,
                                             const AttentionWeights& weights,
                                             const AttentionAxes& axes = {});
};

/// The per-device KV cache of one attention layer: k and v of shape [B, max_len, kv_heads,
/// head_dim] (bthd) or [B, kv_heads, max_len, head_dim] (bhtd), batch split like the
/// activations and kv heads like the layer's wk. Shared by the prefill, insert and decode
/// programs of a model; positions [0, length) hold valid entries (length is the caller's
/// bookkeeping).
struct KvCache {
  KvLayout layout = KvLayout::kBTHD;
  std::int64_t batch = 0;
  std::int64_t max_len = 0;
  std::shared_ptr<runtime::ShardedTensor> k, v;

  /// A zeroed cache for `layer`, sequences split by `batch_entry` (the spec entry of the
  /// activations' batch dim), its keys and values stored as `dtype`: f32, or bf16 / f16 (half
  /// the bytes: each key and value rounded to nearest even as it is written, widened exactly as
  /// attention reads it).
  /// Throws: ShapeError when batch or max_len is not positive, or a 16-bit cache's head size is
  /// not a multiple of 16; TypeError for another dtype.
  [[nodiscard]] static KvCache create(const runtime::DeviceMesh& mesh, const AttentionLayer& layer,
                                      std::int64_t batch, std::int64_t max_len, KvLayout layout,
                                      const sharding::AxisRule& batch_entry,
                                      DType dtype = DType::kF32);
};

/// The paged KV cache of one attention layer: k and v of shape [blocks, kv_heads, block_size,
/// head_dim], kv heads split like the layer's wk, every device holding every block of its heads.
/// Which blocks hold which sequence's positions is the caller's bookkeeping (block tables in a
/// RaggedBatch); block 0 is where padding tokens write.
struct PagedKvCache {
  std::int64_t blocks = 0;
  std::int64_t block_size = 0;
  std::shared_ptr<runtime::ShardedTensor> k, v;

  /// A zeroed cache of `blocks` blocks of `block_size` positions for `layer`, stored as `dtype`
  /// (as KvCache::create).
  /// Throws: ShapeError when blocks < 2 or block_size < 1, or as KvCache::create for `dtype`.
  [[nodiscard]] static PagedKvCache create(const runtime::DeviceMesh& mesh,
                                           const AttentionLayer& layer, std::int64_t blocks,
                                           std::int64_t block_size, DType dtype = DType::kF32);
};

/// The tokens of one ragged step, flattened: token i of the step belongs to a sequence that
/// stands at positions[i], writes its key and value into cache slot slots[i] (block * block_size
/// + offset) and attends to the first context[i] = positions[i] + 1 positions of its sequence,
/// whose block table starts at tables[table_of[i]]. Padding tokens (a program compiled for
/// more tokens than the step has) write to block 0 and see one key. Filled by the caller before
/// each run; programs read it when they run.
struct RaggedBatch {
  std::vector<std::int64_t> positions;
  std::vector<std::int64_t> slots;
  std::vector<std::int64_t> context;
  std::vector<std::int64_t> table_of;
  std::vector<std::int32_t> tables;
  /// The most keys any token may see (fixed when the programs are compiled: scratch sizes).
  std::int64_t max_context = 0;
};

/// How one attention program treats positions and the cache.
struct AttentionStep {
  /// Null: full sequences (train): keys are x's tokens only, positions from 0. Otherwise
  /// sequence b's tokens are written into the cache at positions [p, p + T), p =
  /// (*positions)[b], and attend to the cache's positions [0, p + t] (prefill: p = 0; insert: a
  /// chunk at p; decode: T = 1). Sequences may stand at different positions (a batch of
  /// prompts of different lengths).
  KvCache* cache = nullptr;
  /// Each sequence's first new position, one per sequence of x; read when the program runs
  /// (so one compiled program serves every decode step).
  /// REQUIRES with a cache: non-null with one entry per sequence; the caller keeps every
  /// 0 <= p and p + T <= max_len.
  const std::vector<std::int64_t>* positions = nullptr;
  /// A ragged step over a paged cache instead (x is [1, N, H]: N tokens of any sequences,
  /// each at its own position, the tokens whole on every device): each token's key and value
  /// are written into its slot, and each token attends to its own sequence's positions through
  /// its block table (paged_attention). Both non-null, or both null; not with `cache`.
  PagedKvCache* paged = nullptr;
  const RaggedBatch* ragged = nullptr;
};

/// What a forward emit_attention keeps for its backward (program-owned; filled by it).
struct AttentionSaved {
  runtime::ShardedTensor* x = nullptr;  ///< the input
  runtime::ShardedTensor* k_local =
      nullptr;  ///< this run's keys [B, T, KV * D] after RoPE, split as x's tokens
  runtime::ShardedTensor* k = nullptr;  ///< the keys attention read (gathered over T's axes)
  runtime::ShardedTensor* v = nullptr;  ///< the values attention read
  std::vector<runtime::Tensor*> q;    ///< per slot: its queries [rows, local heads * D] after RoPE
  std::vector<runtime::Tensor*> out;  ///< per slot: attention's output before wo, like q
  /// Per slot, with q/k norms: q [rows, local heads * D] and this run's k [rows, local kv heads
  /// * D] as they entered the norms (after the biases); null entries without them.
  std::vector<runtime::Tensor*> q_pre, k_pre;
  std::vector<sharding::Placement>
      partial_placed;  ///< the output projection's (Partial over heads)
};

/// Emits y = attention(x) into `program`: per device, its sequences' q, k, v projections for
/// its heads, RoPE at the tokens' positions, the cache write (with a cache), causal attention
/// on those heads, the output projection of its heads (a Partial(sum) over the heads axis),
/// then reshard() into y: one all-reduce over tp when heads are split. x is [B, T, H] with B
/// and T (sequence parallel: keys and values all-gathered over T's axes before attention; every
/// rank keeps the whole cache) split; H whole. y must have x's shape and layout. Returns the
/// frontier after which y is complete. With `saved` (training: no cache), also keeps what
/// emit_attention_backward needs. Throws: ShapeError when x, y or the cache do not fit the layer
/// (naming them); as reshard().
runtime::Frontier emit_attention(ProgramBuilder& program, const AttentionLayer& layer,
                                 runtime::ShardedTensor& x, const runtime::Frontier& after,
                                 runtime::ShardedTensor& y, const std::string& name,
                                 const AttentionStep& step = {}, AttentionSaved* saved = nullptr);

/// A parameter gradient for each of an AttentionLayer's projections, laid out as it is
/// (gradient_like: stored out-in, same spec), fp32; and for each bias and q/k norm the layer
/// has (null where it has none).
struct AttentionGradients {
  std::shared_ptr<runtime::ShardedTensor> wq, wk, wv, wo;
  std::shared_ptr<runtime::ShardedTensor> bq, bk, bv, bo, q_norm, k_norm;
  /// Zero gradients laid out like `layer`'s projections.
  [[nodiscard]] static AttentionGradients like(const AttentionLayer& layer);
};

/// Emits the backward of the training-mode emit_attention (no cache) that filled `saved`: given
/// dy (laid out as that x and y), fills dx and overwrites the projections' gradients. Per
/// device: d_out = dy wo over its heads, attention_core_backward (recomputing the
/// probabilities), RoPE turned back on dq and dk, then dx_partial = dq wq + dk wk + dv wv and
/// each projection's dW = d^T in over the device's tokens. Collectives, from the placements
/// (gradients.hpp): dk and dv reduce-scattered back to the token split under sequence
/// parallelism (and all-reduced over the heads axis when it splits query heads but not kv
/// heads, whose keys every device then shares), dx_partial all-reduced over the heads axis,
/// the weights' gradients all-reduced over the axes splitting the tokens. A layer's biases and
/// q/k norms (Qwen2, Qwen3) get gradients too: the q/k norms' backward per head on dq and dk
/// (from q and k as the forward kept them before the norms), each bias its outputs' gradient
/// summed over the rows, laid out like the bias (bq split like wq's heads), reduced as the
/// projections' are; a q/k norm's also over the heads axis when it splits those heads.
/// Returns the frontier after which dx and every gradient are complete.
/// `dx_ready` (when given) receives the frontier after which dx alone is complete: what the
/// next backward in a chain waits for, so that the gradients' reductions overlap the rest of
/// the backward instead of holding it up.
/// Throws: ShapeError when dy, dx or a gradient does not fit (naming them); ValueError when the
/// forward kept nothing or a bias or norm of the layer has no gradient in `grads`.
runtime::Frontier emit_attention_backward(ProgramBuilder& program, const AttentionLayer& layer,
                                          const AttentionSaved& saved, runtime::ShardedTensor& dy,
                                          const runtime::Frontier& after,
                                          runtime::ShardedTensor& dx,
                                          const AttentionGradients& grads, const std::string& name,
                                          runtime::Frontier* dx_ready = nullptr);

/// An attention layer lowered onto a device mesh (causal, RoPE, MHA or GQA), optionally with
/// a KV cache: forward(x, position) compiles one program per distinct token count T on first
/// use (prefill, insert chunks and decode steps each get theirs, all sharing the weights and
/// the cache) and runs it. Not thread-safe: one thread drives an instance.
class ShardedAttention {
 public:
  /// Lays out the weights; with max_len > 0 allocates a KV cache of max_len positions for
  /// `batch` sequences, in `layout`.
  /// Throws: as AttentionLayer::create; ShapeError when batch is not positive or max_len is
  /// negative.
  ShardedAttention(runtime::DeviceMesh mesh, const AttentionConfig& config,
                   const AttentionWeights& weights, std::int64_t batch, std::int64_t max_len = 0,
                   AttentionAxes axes = {}, KvLayout layout = KvLayout::kBTHD);
  ~ShardedAttention();
  ShardedAttention(ShardedAttention&&) noexcept;
  ShardedAttention& operator=(ShardedAttention&&) noexcept;

  /// y = attention(x) for x [batch, T, H] whose tokens sit at positions [position, position +
  /// T). Without a cache position must be 0 and keys are x's own tokens; with one, x's keys and
  /// values are written into the cache first and the queries see positions [0, position + t].
  /// Throws: ShapeError for an x of another batch or hidden size; IndexError when the tokens
  /// do not fit the cache (naming position, T and max_len) or position is not 0 without one.
  runtime::HostTensor forward(const runtime::HostTensor& x, std::int64_t position = 0);

  /// The layer (specs, heads per device).
  const AttentionLayer& layer() const noexcept { return layer_; }
  /// Query heads per device (num_heads when heads are not split).
  std::int64_t local_heads() const noexcept { return layer_.local_q_heads; }
  /// The program compiled for T new tokens. Throws: KeyError when none was compiled yet.
  Program& program(std::int64_t tokens);

 private:
  Program& compiled_for(std::int64_t tokens);
  runtime::DeviceMesh mesh_;
  AttentionAxes axes_;
  AttentionLayer layer_;
  std::int64_t batch_;
  std::optional<KvCache> cache_;
  std::vector<std::int64_t>
      positions_;  // each sequence's; read by the programs' nodes when they run
  ProgramCache<> programs_;
};

}  // namespace numesh::ops
