#pragma once

#include <cstdint>
#include <vector>

#include "numesh/ops/lm_head_config.hpp"
#include "numesh/runtime/tensor.hpp"

// The LM head references (see reference/mlp.hpp for what the references are).

namespace numesh::ops {

/// logits = x w in float64 (w as stored_as stores it; bf16 weights multiply bf16-rounded x),
/// rounded to fp32 once. x is [rows, H]; returns [rows, V].
/// Throws: ShapeError naming the shapes when x is not [rows, H] for w [H, V].
runtime::HostTensor lm_head_reference(const runtime::HostTensor& x, const LmHeadWeights& weights);

/// The index of each row's largest value, the first one on ties, a NaN counting as larger
/// than any number (torch.argmax's rule). logits is [rows, V].
/// Throws: ShapeError when logits is not a matrix with at least one column.
std::vector<std::int64_t> argmax_rows(const runtime::HostTensor& logits);

}  // namespace numesh::ops
