#pragma once

#include <cstdint>
#include <memory>

#include "numesh/core/dtype.hpp"
#include "numesh/ops/transformer_config.hpp"
#include "numesh/runtime/tensor.hpp"

// The dense transformer stack (see reference/mlp.hpp for what the references are).

namespace numesh::ops {

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
  /// `kv_dtype` bf16 or f16: each key and value is cached as the lowered model's 16-bit caches
  /// hold it (its fp32 value rounded to nearest even), f32: as computed.
  TransformerReference(TransformerConfig config, TransformerWeights weights, std::int64_t batch,
                       std::int64_t max_len, std::int64_t batch_groups = 1,
                       std::int64_t sequence_groups = 1, DType kv_dtype = DType::kF32);
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
  DType kv_dtype_;
  std::unique_ptr<Caches> caches_;
};

}  // namespace numesh::ops
