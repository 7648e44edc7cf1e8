#pragma once

#include <cstdint>
#include <span>

#include "numesh/ops/kernels/attention_core.hpp"

// Attention over a paged KV cache for a ragged batch: the tokens of several sequences, each
// at its own position, flattened into one list (decode tokens and prefill chunks together),
// each reading its own sequence's keys and values through that sequence's block table.

namespace numesh::ops {

/// Where a paged cache's keys and values live: key slot j of kv head h in block b is
/// k[b * block_stride + h * head_stride + j * pos_stride] (elements of `dtype`: fp32, or bf16 /
/// f16 bits), v likewise; a sequence's position p sits in slot p % block_size of its block
/// table's entry p / block_size.
struct PagedKvView {
  const void* k = nullptr;
  const void* v = nullptr;
  std::int64_t block_size = 16;
  std::int64_t block_stride = 0;
  std::int64_t head_stride = 0;
  std::int64_t pos_stride = 0;
  DType dtype = DType::kF32;
};

/// The tokens of a ragged batch as attention sees them: token t sees keys [0, context[t]) of
/// the sequence whose block table starts at tables[table_of[t]] (the tokens of one sequence
/// share its table).
struct RaggedKeys {
  std::span<const std::int64_t> context;
  std::span<const std::int64_t> table_of;
  std::span<const std::int32_t> tables;
};

/// Scratch floats paged_attention needs for `tokens` tokens of `q_heads` heads of `head_dim`,
/// none seeing more than `max_context` keys, in an arena of `threads` threads.
std::int64_t paged_attention_scratch_floats(std::int64_t tokens, std::int64_t q_heads,
                                            std::int64_t head_dim, std::int64_t max_context,
                                            std::int64_t threads) noexcept;

/// softmax(q k^T / sqrt(head_dim)) v for each token of a ragged batch over its own keys,
/// without RoPE and without allocating, over the calling thread's oneTBB arena: q and out are
/// [tokens, slice.q_heads, head_dim]; query head i reads kv head (slice.q_head_offset + i) /
/// slice.group - slice.kv_head_offset of the cache (slice's batch, q_len and kv_len are not
/// used). One task per (token, block of 256 keys, run of up to kKeyBlockMaxHeads query heads of
/// one kv head) computes each head's block max, sum of exponentials and weighted sum of values,
/// reading the block's keys and values once for the run; the blocks are merged in order per
/// (token, head).
/// This is attention_core's decode arithmetic, key for key: a token's result depends on its
/// query and its keys only, not on the batch around it or the thread count, and equals
/// attention_core's for a single query (bitwise) on the same keys.
/// A 16-bit cache gives the bits of an fp32 one holding its values widened.
/// REQUIRES: every context[t] in [1, max_context] and each table long enough for it.
/// Throws: ShapeError when scratch is short or the spans disagree with `tokens`, or the cache is
/// 16-bit and head_dim not a multiple of 16; TypeError for a cache dtype other than f32, bf16
/// and f16.
void paged_attention(const float* q, const PagedKvView& kv, const RaggedKeys& keys, float* out,
                     std::int64_t tokens, const AttentionSlice& slice, std::int64_t head_dim,
                     std::int64_t max_context, std::span<float> scratch);

}  // namespace numesh::ops
