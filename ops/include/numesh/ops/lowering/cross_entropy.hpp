#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "numesh/ops/lowering/lm_head.hpp"
#include "numesh/ops/lowering/program.hpp"
#include "numesh/runtime/collectives.hpp"
#include "numesh/runtime/tensor.hpp"

// Training's loss: the LM head fused with the cross-entropy of its logits, vocabulary-parallel
// (Megatron's parallel cross-entropy). Each device multiplies the hidden states by its slice of
// the head and keeps its logits; the loss of a row needs only the row's max logit, its sum of
// exponentials and its target's logit, each combined over the vocabulary axes as [rows, 1] or
// [rows, 2] values. The backward turns the logits into their gradient in place. No device ever
// holds a row's full logits.

namespace numesh::ops {

/// What emit_lm_head_cross_entropy keeps for its backward (program-owned tensors).
struct CrossEntropySaved {
  runtime::ShardedTensor* x = nullptr;       ///< the hidden states [rows, H]
  runtime::ShardedTensor* weight = nullptr;  ///< the head's matrix as multiplied ([V, H] stored)
  runtime::ShardedTensor* logits = nullptr;  ///< [rows, V], lm_head_logits_spec
  runtime::ShardedTensor* max = nullptr;     ///< [rows, 1]: each row's max logit, whole-row
  runtime::ShardedTensor* sums = nullptr;    ///< [rows, 2]: sum of exp(l - max), target's logit
  const std::vector<std::int32_t>* targets = nullptr;
};

/// Emits, for x [rows, H] (H not split) and one target per row, losses[r] = logsumexp(l_r) -
/// l_r[targets[r]] with l = x w: per device its logits' slice (device_gemm), each row's local
/// max all-reduced (max) over the vocabulary axes, then each row's sum of exp(l - max) and its
/// target's logit all-reduced (sum). `losses` is [rows, 1], laid out as x's rows. The targets
/// are read when the program runs. With `saved`, keeps what the backward needs.
/// REQUIRES: *targets holds rows ids in [0, V) whenever the program runs, and outlives it
/// (callers check first: check_token_ids).
/// Throws: ShapeError naming the shapes when x or losses do not fit the layer.
runtime::Frontier emit_lm_head_cross_entropy(
    ProgramBuilder& program, const LmHeadLayer& layer, runtime::ShardedTensor& x,
    const std::vector<std::int32_t>* targets, const runtime::Frontier& after,
    runtime::ShardedTensor& losses, const std::string& name, CrossEntropySaved* saved = nullptr);

/// The backward of `scale` times the sum of the losses (scale = 1 / N for the mean over N
/// tokens of the global batch): the logits' gradient scale (softmax(l) - onehot(target)) in
/// place of the saved logits, dx = d_logits w (Partial over the vocabulary axes, all-reduced
/// into dx's layout, x's) and d_weight = d_logits^T x (laid out as the head's matrix:
/// gradient_like; all-reduced over the axes splitting the rows). Overwrites dx and d_weight.
/// Returns the frontier after which both are complete.
/// `dx_ready` (when given) receives the frontier after which dx alone is complete: what the
/// next backward in a chain waits for, so that the gradients' reductions overlap the rest of
/// the backward instead of holding it up.
/// Throws: ShapeError naming the shapes when dx or d_weight does not fit; ValueError when the
/// forward kept nothing (emit_lm_head_cross_entropy without `saved`).
runtime::Frontier emit_lm_head_cross_entropy_backward(
    ProgramBuilder& program, const CrossEntropySaved& saved, double scale,
    const runtime::Frontier& after, runtime::ShardedTensor& dx, runtime::ShardedTensor& d_weight,
    const std::string& name, runtime::Frontier* dx_ready = nullptr);

}  // namespace numesh::ops
