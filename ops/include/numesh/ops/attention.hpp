#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "numesh/ops/reference.hpp"
#include "numesh/ops/program.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/graph.hpp"
#include "numesh/runtime/tensor.hpp"

namespace numesh::ops {

/// Which heads and buffers one call of attention_kernel sees (bthd, row-major): q is
/// [batch, q_len, q_heads, head_dim], k and v are [batch, kv_len, kv_heads, head_dim], out is
/// like q. Query head i (global head q_head_offset + i) reads kv head
/// (q_head_offset + i) / group - kv_head_offset of the buffers.
struct AttentionSlice {
  std::int64_t batch = 1;
  std::int64_t q_len = 1;
  std::int64_t kv_len = 1;
  std::int64_t q_heads = 1;
  std::int64_t kv_heads = 1;
  std::int64_t group = 1;           ///< global num_heads / num_kv_heads
  std::int64_t q_head_offset = 0;   ///< global index of the first query head here
  std::int64_t kv_head_offset = 0;  ///< global index of the first kv head here
};

/// Rotary position embedding (rotate-half form) in place on a raw row-major [b, t, h, d]
/// buffer whose token t sits at position first_position + t; angles computed in double.
/// REQUIRES: d even.
void rope_inplace(float* x, std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d,
                  std::int64_t first_position, float theta);

/// A whole fp32 attention on one thread, on raw buffers, without allocating: applies RoPE in
/// place to q (positions config.q_offset + t) and k (positions s) when config.rope_theta > 0,
/// then writes softmax(q k^T / sqrt(d) + causal mask) v into out, one query at a time (the
/// single-thread baseline of ops_bench; the lowered layers call attention_core, and the
/// references have float64 code of their own). `scratch` holds kv_len floats.
/// REQUIRES: shapes as in AttentionSlice, validated by the caller.
void attention_kernel(float* q, float* k, const float* v, float* out, const AttentionSlice& slice,
                      const AttentionConfig& config, std::span<float> scratch);

/// Where keys and values live: element (b, s, h, i) of k is k[b * batch_stride + s * pos_stride
/// + h * head_stride + i] (strides in floats), v likewise. Describes a bthd or bhtd KV cache
/// as well as a plain bthd buffer.
struct KvView {
  const float* k = nullptr;
  const float* v = nullptr;
  std::int64_t batch_stride = 0;
  std::int64_t pos_stride = 0;
  std::int64_t head_stride = 0;
};

/// Scratch floats attention_core needs for `q_len` queries over up to `kv_capacity` keys of
/// dim `head_dim`.
std::int64_t attention_scratch_floats(std::int64_t q_len, std::int64_t kv_capacity, std::int64_t head_dim) noexcept;

/// softmax(q k^T / sqrt(head_dim) + mask) v without RoPE and without allocating: q and out
/// are bthd [slice.batch, slice.q_len, slice.q_heads, head_dim]; the keys are positions
/// [0, slice.kv_len) of `kv`; query t sits at position q_offset + t and, when `causal`, sees
/// keys 0..q_offset + t. From 16 queries up, each (sequence, kv head) has its keys and values
/// copied into contiguous panels and blocks of 64 queries run as two GEMMs (q k^T, then p v)
/// around a row softmax, skipping the key blocks the causal mask hides; fewer queries (decode)
/// take one key at a time. `scratch` holds at least attention_scratch_floats(slice.q_len,
/// slice.kv_len, head_dim) floats. REQUIRES: q_offset + q_len <= kv_len when causal.
void attention_core(const float* q, const KvView& kv, float* out, const AttentionSlice& slice,
                    std::int64_t head_dim, std::int64_t q_offset, bool causal,
                    std::span<float> scratch);

/// The weights of an attention layer (head-major columns: head h owns columns
/// [h * head_dim, (h + 1) * head_dim)).
struct AttentionWeights {
  runtime::HostTensor wq;  ///< [H, num_heads * head_dim]
  runtime::HostTensor wk;  ///< [H, num_kv_heads * head_dim]
  runtime::HostTensor wv;  ///< [H, num_kv_heads * head_dim]
  runtime::HostTensor wo;  ///< [num_heads * head_dim, H]
};

/// The dense attention layer, the oracle of ShardedAttention (float64 arithmetic of its own,
/// rounded once): q, k, v = x wq, x wk, x wv; attention_reference (causal from position 0,
/// RoPE per config); times wo. x is [B, T, H]; returns [B, T, H].
/// Throws: ShapeError naming the shapes when x and the weights do not fit the config.
runtime::HostTensor attention_layer_reference(const runtime::HostTensor& x, const AttentionWeights& weights,
                                              const AttentionConfig& config);

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

/// Memory layout of a KV cache (EasyDeL's attention layouts).
enum class KvLayout : std::uint8_t {
  kBTHD,  ///< [batch, position, kv_heads, head_dim]: one token's heads together
  kBHTD,  ///< [batch, kv_heads, position, head_dim]: one head's positions together
};

/// "bthd" or "bhtd".
std::string_view to_string(KvLayout layout) noexcept;

/// An attention layer's weights laid out on a mesh (heads split at head granularity, see
/// AttentionAxes), shared by every program that runs the layer.
struct AttentionLayer {
  AttentionConfig config;
  std::int64_t hidden = 0;
  std::string heads_axis;  ///< the axis splitting heads; empty when none does
  std::int64_t local_q_heads = 0;
  std::int64_t local_kv_heads = 0;
  std::shared_ptr<runtime::ShardedTensor> wq, wk, wv, wo;

  /// True when query heads are split over heads_axis.
  bool splits_heads() const noexcept { return !heads_axis.empty(); }
  /// True when kv heads are split too.
  bool splits_kv_heads() const noexcept { return splits_heads() && local_kv_heads < config.num_kv_heads; }

  /// Validates and lays out the weights.
  /// Throws: ShapeError naming the shapes when the weights do not fit the config, or head_dim
  /// is odd with RoPE on; ValueError when num_kv_heads does not divide num_heads or
  /// config.q_offset is not 0 (positions are given per run).
  [[nodiscard]] static AttentionLayer create(const runtime::DeviceMesh& mesh, const AttentionConfig& config,
                                             const AttentionWeights& weights, const AttentionAxes& axes = {});
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
  /// activations' batch dim). Throws: ShapeError when batch or max_len is not positive.
  [[nodiscard]] static KvCache create(const runtime::DeviceMesh& mesh, const AttentionLayer& layer,
                                      std::int64_t batch, std::int64_t max_len, KvLayout layout,
                                      const sharding::AxisRule& batch_entry);
};

/// FLOPs of one attention layer run over `batch` sequences of `q_len` new tokens whose first
/// sits at `position` (causal: token t attends to position + t + 1 keys): the four
/// projections plus QK^T and PV, multiply-add = 2.
double attention_flops(const AttentionConfig& config, std::int64_t hidden, std::int64_t batch,
                       std::int64_t q_len, std::int64_t position);

/// How one attention program treats positions and the cache.
struct AttentionStep {
  /// Null: full sequences (train): keys are x's tokens only, positions from 0. Otherwise x's
  /// tokens are written into the cache at positions [*position, *position + T) and attend to
  /// the cache's positions [0, *position + t] (prefill: *position = 0; insert: a chunk at
  /// *position; decode: T = 1).
  KvCache* cache = nullptr;
  /// Read when the program runs (so one compiled program serves every decode step).
  /// REQUIRES with a cache: non-null; the caller keeps 0 <= *position, *position + T <= max_len.
  const std::int64_t* position = nullptr;
};

/// Emits y = attention(x) into `program`: per device, its sequences' q, k, v projections for
/// its heads, RoPE at the tokens' positions, the cache write (with a cache), causal attention
/// on those heads, the output projection of its heads (a Partial(sum) over the heads axis),
/// then reshard() into y: one all-reduce over tp when heads are split. x is [B, T, H] with B
/// and T (sequence parallel: keys and values all-gathered over T's axes before attention; every
/// rank keeps the whole cache) split; H whole. y must have x's shape and layout. Returns the frontier after which y is
/// complete. Throws: ShapeError when x, y or the cache do not fit the layer (naming them); as
/// reshard().
runtime::Frontier emit_attention(ProgramBuilder& program, const AttentionLayer& layer,
                                 runtime::ShardedTensor& x, const runtime::Frontier& after,
                                 runtime::ShardedTensor& y, const std::string& name,
                                 const AttentionStep& step = {});

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
  struct Compiled;
  Compiled& compiled_for(std::int64_t tokens);
  runtime::DeviceMesh mesh_;
  AttentionAxes axes_;
  AttentionLayer layer_;
  std::int64_t batch_;
  std::optional<KvCache> cache_;
  std::int64_t position_ = 0;  // read by the programs' nodes when they run
  std::vector<std::unique_ptr<Compiled>> programs_;
};

}  // namespace numesh::ops
