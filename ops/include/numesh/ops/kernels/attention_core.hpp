#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "numesh/core/dtype.hpp"
#include "numesh/ops/attention_config.hpp"

// The attention arithmetic on raw buffers, no mesh: softmax(q k^T / sqrt(d) + mask) v for a
// slice of heads, one query at a time (decode) or in blocks of queries as GEMMs (prefill).

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

/// A whole fp32 attention on one thread, on raw buffers, without allocating: applies RoPE in
/// place to q (positions config.q_offset + t) and k (positions s) when config.rope_theta > 0,
/// then writes softmax(q k^T / sqrt(d) + causal mask) v into out, one query at a time (the
/// single-thread baseline of ops_bench; the lowered layers call attention_core, and the
/// references have float64 code of their own). `scratch` holds kv_len floats.
/// REQUIRES: shapes as in AttentionSlice, validated by the caller.
void attention_kernel(float* q, float* k, const float* v, float* out, const AttentionSlice& slice,
                      const AttentionConfig& config, std::span<float> scratch);

/// Where keys and values live: element (b, s, h, i) of k is k[b * batch_stride + s * pos_stride
/// + h * head_stride + i] (strides in elements), v likewise, the elements of `dtype`: fp32, or
/// bf16 / f16 bits (a KV cache kept in half the bytes, widened exactly as attention reads it).
/// Describes a bthd or bhtd KV cache as well as a plain bthd buffer.
struct KvView {
  const void* k = nullptr;
  const void* v = nullptr;
  std::int64_t batch_stride = 0;
  std::int64_t pos_stride = 0;
  std::int64_t head_stride = 0;
  DType dtype = DType::kF32;

  /// The same view from sequence b on.
  [[nodiscard]] KvView from_sequence(std::int64_t b) const noexcept;
};

/// Refuses keys and values stored as `dtype` with heads of `head_dim`, the error starting with
/// `who`: TypeError for a dtype other than f32, bf16 and f16; ShapeError for a 16-bit one and a
/// head size that is not a multiple of 16 (the 16-bit kernels' chunks).
void check_kv_dtype(DType dtype, std::int64_t head_dim, std::string_view who);

/// Scratch floats attention_core needs for `slice` (with kv_len the most keys it will see)
/// and head dim `head_dim` when called from an arena of `threads` threads over keys and values
/// of `kv_dtype`: a block per thread (with a 16-bit cache, prefill's blocks hold the keys and
/// values it widens too), plus, for decode, the per-key-block partial results.
std::int64_t attention_scratch_floats(const AttentionSlice& slice, std::int64_t head_dim,
                                      std::int64_t threads, DType kv_dtype = DType::kF32) noexcept;

/// softmax(q k^T / sqrt(head_dim) + mask) v without RoPE and without allocating, over the
/// calling thread's oneTBB arena (a device's threads when called from a node body): q and out
/// are bthd [slice.batch, slice.q_len, slice.q_heads, head_dim]; the keys are positions
/// [0, slice.kv_len) of `kv`; query t sits at position q_offset + t and, when `causal`, sees
/// keys 0..q_offset + t.
/// - From 16 queries up (prefill): one task per (sequence, head, block of 64 queries), two GEMMs
///   (q k^T, then p v) around a row softmax that read q, keys and values in place through their
///   strides, skipping the key blocks the causal mask hides.
/// - Fewer queries (decode): one task per (sequence, block of 256 keys, run of up to
///   kKeyBlockMaxHeads query heads of one kv head) computing each head's block max, sum of
///   exponentials and weighted sum of values, reading the block's keys and values once for the
///   run; then the blocks merged in order per (sequence, head) (flash-decoding's split
///   softmax).
/// The tasks depend on the shapes only, so results are bitwise identical for any number of
/// threads. `scratch` holds at least attention_scratch_floats(slice, head_dim, threads,
/// kv.dtype) floats for the arena's max_concurrency `threads`. A 16-bit kv gives the bits of an
/// fp32 kv holding its values widened.
/// REQUIRES: q_offset + q_len <= kv_len when causal. Throws: ShapeError when scratch is short,
/// or kv is 16-bit and head_dim not a multiple of 16; TypeError for a kv dtype other than f32,
/// bf16 and f16.
void attention_core(const float* q, const KvView& kv, float* out, const AttentionSlice& slice,
                    std::int64_t head_dim, std::int64_t q_offset, bool causal,
                    std::span<float> scratch);

}  // namespace numesh::ops
