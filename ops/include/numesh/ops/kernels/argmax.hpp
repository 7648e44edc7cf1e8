#pragma once

#include <cstdint>

#include "numesh/ops/eigen_views.hpp"

// Each row's largest logits over a slice of the vocabulary: the per-device half of the sharded
// argmax and top-k (the host compares the devices' candidates); and each row's log-sum-exp over
// the slice, the per-device half of the softmax's normaliser (log-probabilities).

namespace numesh::ops {

/// For each row r of `logits` (a device's columns [first_index, first_index + cols) of the
/// vocabulary), out[2r] = the row's largest value and out[2r + 1] = its global index
/// (first_index + column) as an fp32 number, the first such column on ties; a NaN counts as
/// larger than any number, the first NaN wins (torch.argmax's rule). Rows run as tasks over
/// the calling thread's arena; bitwise the same for any thread count.
/// REQUIRES: logits has at least one column; first_index + cols <= kMaxVocabulary; out holds
/// 2 * rows floats.
void row_argmax(ConstMatrixMap logits, std::int64_t first_index, float* out);

/// For each row r of `logits` (a device's columns [first_index, first_index + cols)), its `k`
/// largest values with their global indices as fp32, largest first (the lower index first among
/// equal values, a NaN above any number): out[r * 2k + 2i] = value i, out[r * 2k + 2i + 1] = its
/// index. Rows run as tasks over the calling thread's arena; bitwise the same for any thread count.
/// REQUIRES: 1 <= k <= cols; first_index + cols <= kMaxVocabulary (columns are held as fp32
/// while the rows are scanned); out holds 2 * k * rows floats and overlaps no row of logits
/// (each row's half of it is the scan's scratch).
void row_top_k(ConstMatrixMap logits, std::int64_t first_index, std::int64_t k, float* out);

/// For each row r of `logits`, out[r] = log(sum_j exp(logits[r, j])), computed in double as
/// m + log(sum_j exp(logits[r, j] - m)) with m the row's largest value (no overflow), summed in
/// column order: each row's value depends on that row alone. A row of -inf gives -inf, a row
/// holding NaN or +inf gives that. Rows run as tasks over the calling thread's arena.
/// REQUIRES: logits has at least one column; out holds rows floats.
void row_log_sum_exp(ConstMatrixMap logits, float* out);

}  // namespace numesh::ops
