#pragma once

#include <string>

#include "numesh/ops/lowering/program.hpp"
#include "numesh/runtime/tensor.hpp"

// LayerNorm on the mesh (torch.nn.LayerNorm over the hidden dim, GPT-2 and BERT style, with a
// weight and an optional bias): one node per device over its rows, no collective in the
// forward (the hidden dim is whole on every device); the backward reduces the weight's and the
// bias' gradients over the axes splitting the rows. No model numesh loads uses it yet; it is an
// operator of its own, checked against the dense reference and PyTorch.

namespace numesh::ops {

/// Emits out = layernorm(x) .* weight + bias per row of each device's shards, after `after`;
/// 8 FLOPs per element. x and out [..., H] are laid out alike with H whole; weight and bias
/// (null: none) are [1, H] and replicated.
/// Returns the frontier after which out is complete.
/// Throws: ShapeError naming the shapes and specs when x and out are not laid out alike, H is
/// split, or weight or bias is not a replicated [1, H].
runtime::Frontier emit_layernorm(ProgramBuilder& program, runtime::ShardedTensor& x,
                                 runtime::ShardedTensor& weight, runtime::ShardedTensor* bias,
                                 runtime::ShardedTensor& out, float eps,
                                 const runtime::Frontier& after, const std::string& name);

/// The backward of emit_layernorm on x: given d_out (laid out as out), writes d_x (laid out as
/// x; may be d_out's tensor) and overwrites d_weight and d_bias (laid out as the weight:
/// gradient_like; d_bias null: not wanted) with their gradients, reduced over the axes
/// splitting the rows (each device summed over its own).
/// Returns the frontier after which d_x, d_weight and d_bias are complete.
/// Throws: ShapeError naming the shapes and specs when the tensors are not laid out alike or a
/// gradient not like the weight.
runtime::Frontier emit_layernorm_backward(ProgramBuilder& program, runtime::ShardedTensor& x,
                                          runtime::ShardedTensor& weight,
                                          runtime::ShardedTensor& d_out,
                                          runtime::ShardedTensor& d_x,
                                          runtime::ShardedTensor& d_weight,
                                          runtime::ShardedTensor* d_bias, float eps,
                                          const runtime::Frontier& after, const std::string& name);

}  // namespace numesh::ops
