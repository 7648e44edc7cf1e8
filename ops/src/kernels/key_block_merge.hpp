#pragma once

// PRIVATE to ops/src/kernels: the last pass of decode and paged attention, which attend each
// (query, head) to its keys a block of keys at a time (attend_key_block) and merge the blocks'
// partial results here.

#include <cstdint>

namespace numesh::ops::detail {

/// For every sequence b < batch, query head h < q_heads and query t < q_len: out at ((b * q_len +
/// t) * q_heads + h) * d (d floats) = the softmax-weighted merge of its `blocks` key blocks'
/// partials, which lie from partials + (((b * q_heads + h) * q_len + t) * blocks) * stride, a
/// block's (max score, sum of exponentials, d unnormalized values) `stride` floats apart; a block
/// whose sum is 0 (hidden by the causal mask, or past the query's context) is skipped. Over the
/// calling thread's arena when the partials are large enough to pay for tasks, else on the
/// calling thread (a decode step of one sequence merges a few thousand floats: the tasks cost
/// more than the work); each (query, head) by the same arithmetic either way.
void merge_key_blocks(const float* partials, std::int64_t batch, std::int64_t q_heads,
                      std::int64_t q_len, std::int64_t blocks, std::int64_t d, std::int64_t stride,
                      float* out);

}  // namespace numesh::ops::detail
