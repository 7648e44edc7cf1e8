#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "numesh/ops/reference.hpp"
#include "numesh/ops/reshard.hpp"
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

/// The attention computation of attention_reference on raw buffers, without allocating:
/// applies RoPE in place to q (positions config.q_offset + t) and k (positions s) when
/// config.rope_theta > 0, then writes softmax(q k^T / sqrt(d) + causal mask) v into out.
/// `scores` is scratch of at least kv_len floats. REQUIRES: shapes as in AttentionSlice,
/// validated by the caller.
void attention_kernel(float* q, float* k, const float* v, float* out, const AttentionSlice& slice,
                      const AttentionConfig& config, std::span<float> scores);

/// The weights of an attention layer (head-major columns: head h owns columns
/// [h * head_dim, (h + 1) * head_dim)).
struct AttentionWeights {
  runtime::HostTensor wq;  ///< [H, num_heads * head_dim]
  runtime::HostTensor wk;  ///< [H, num_kv_heads * head_dim]
  runtime::HostTensor wv;  ///< [H, num_kv_heads * head_dim]
  runtime::HostTensor wo;  ///< [num_heads * head_dim, H]
};

/// Mesh axes of the attention layer. Every field has a default.
struct AttentionAxes {
  /// Sequences (dim B of x) split over these axes; replicated when B does not divide.
  std::vector<std::string> batch = {"dp", "fsdp"};
  /// Heads split over this axis: wq, wk, wv column-parallel by whole heads, wo row-parallel,
  /// and the output's partial sums all-reduced over it. Query heads are split when num_heads
  /// divides; kv heads too when num_kv_heads divides as well (else each device computes all kv
  /// heads); nothing is split otherwise.
  std::string heads = "tp";
};

/// An attention layer (prefill / train: full sequences, causal, RoPE, MHA or GQA, layout bthd)
/// lowered onto a device mesh: per device, its sequences' q, k, v projections for its heads,
/// attention on those heads, the output projection of its heads (a Partial(sum) over the
/// heads axis), then reshard() to the replicated output: one all-reduce over tp.
/// KV caches and decoding are not lowered yet (attention_reference covers them).
/// Not thread-safe: one thread drives an instance.
class ShardedAttention {
 public:
  /// Lays out the weights and compiles the graph for x [batch, seq_len, H].
  /// Throws: ShapeError naming the shapes when the weights do not fit the config; ValueError
  /// when num_kv_heads does not divide num_heads or config.q_offset is not 0.
  ShardedAttention(runtime::DeviceMesh mesh, const AttentionConfig& config,
                   const AttentionWeights& weights, std::int64_t batch, std::int64_t seq_len,
                   AttentionAxes axes = {});

  /// y = attention(x) [batch, seq_len, H]. Throws: ShapeError for another x shape.
  runtime::HostTensor forward(const runtime::HostTensor& x);

  /// Query heads per device (num_heads when heads are not split).
  std::int64_t local_heads() const noexcept { return local_q_heads_; }
  /// The collectives of the output reshard.
  const std::vector<sharding::ReshardStep>& collectives() const noexcept { return reshard_.plan; }
  /// The compiled graph.
  runtime::CompiledGraph& graph() noexcept { return *graph_; }

 private:
  AttentionConfig config_;
  std::int64_t batch_, seq_len_, hidden_;
  std::int64_t local_q_heads_ = 0, local_kv_heads_ = 0;
  std::unique_ptr<runtime::ShardedTensor> x_, wq_, wk_, wv_, wo_, y_partial_, y_;
  std::vector<runtime::Tensor> q_, k_, v_, o_;  // per slot scratch
  std::vector<std::vector<float>> scores_;      // per slot softmax scratch
  ReshardResult reshard_;
  std::unique_ptr<runtime::CompiledGraph> graph_;
};

}  // namespace numesh::ops
