#pragma once

#include <cstdint>
#include <span>

#include "numesh/ops/kernels/attention_core.hpp"

// The backward of attention_core for training (full sequences, no cache), recomputing the
// attention probabilities block by block from q and k instead of storing a T x T matrix (the
// FlashAttention-2 recipe, in two deterministic passes).

namespace numesh::ops {

/// Scratch floats attention_core_backward needs for `slice` and `head_dim` when called from an
/// arena of `threads` threads.
std::int64_t attention_backward_scratch_floats(const AttentionSlice& slice, std::int64_t head_dim,
                                               std::int64_t threads) noexcept;

/// Given q, k, v as attention_core read them (bthd; keys and values plain [batch, kv_len,
/// kv_heads, head_dim] buffers, after RoPE) and d_out (the gradient of its output, like q),
/// writes dq (like q) and dk, dv (like k; each kv head's gradient summed over the query heads of
/// the slice that read it, zero for kv heads none read). Query t sits at position q_offset + t.
/// Two passes over the calling thread's arena, every task's result its own rows:
///  1. per (sequence, query head, block of 64 queries): the scores and softmax again, dP = d_out
///     v^T, dS = P .* (dP - rowsum(P .* dP)), dq = dS k / sqrt(d); each row's log-sum-exp and
///     rowsum kept in the scratch;
///  2. per (sequence, kv head, block of 64 keys): over the query heads and query blocks that see
///     the block, P from the kept log-sum-exp, dv += P^T d_out, dk += dS^T q / sqrt(d).
/// Seven GEMM-sized products against the forward's two; results are bitwise the same for any
/// number of threads. REQUIRES: q_offset + q_len <= kv_len when causal.
/// Throws: ShapeError when scratch holds fewer than attention_backward_scratch_floats() floats.
void attention_core_backward(const float* q, const float* k, const float* v, const float* d_out,
                             float* dq, float* dk, float* dv, const AttentionSlice& slice,
                             std::int64_t head_dim, std::int64_t q_offset, bool causal,
                             std::span<float> scratch);

}  // namespace numesh::ops
