#pragma once

#include <string>

#include "numesh/ops/kernels/norms.hpp"
#include "numesh/ops/lowering/program.hpp"
#include "numesh/runtime/collectives.hpp"
#include "numesh/runtime/tensor.hpp"

// RMSNorm on the mesh, fused with the residual add that precedes it in a transformer block:
// one node per device over its rows, no collective (the hidden dim is whole on every device).

namespace numesh::ops {

/// Emits out = rmsnorm(a + b) .* (weight + norm.weight_offset) per row of each device's
/// shards (rmsnorm_rows, eps norm.eps): the residual add
/// (when `b` is given), the sum also kept in `sum` (when given), then the norm (when `weight`
/// is given; otherwise out = a + b). With b null: out = rmsnorm(a) .* weight. One node per
/// device, after `after`; 4 FLOPs per element for the norm, 1 more for the add.
/// REQUIRES: a, b, sum and out laid out alike ([rows, H] per device, H whole), weight [1, H]
/// replicated; not both b and weight null.
/// Returns the frontier after which out (and sum) are complete.
runtime::Frontier emit_residual_rmsnorm(ProgramBuilder& program, runtime::ShardedTensor& a,
                                        runtime::ShardedTensor* b, runtime::ShardedTensor* weight,
                                        runtime::ShardedTensor* sum, runtime::ShardedTensor& out,
                                        RmsNormConstants norm, const runtime::Frontier& after,
                                        const std::string& name);

/// The backward of an RMSNorm that emit_residual_rmsnorm ran on `input` (the sum it kept, or
/// `a` without a residual add) with `weight`: given d_out (the gradient of out, laid out like
/// it), writes d_input = the norm's backward + *d_residual (the gradient the sum received from
/// its other consumer, the residual stream; none when null) and overwrites d_weight (laid out as
/// the weight: gradient_like) with the weight's gradient, all-reduced over the axes splitting
/// the rows (each device summed over its own). The gradient of a residual add is d_input itself
/// for both summands. d_input may be d_out's tensor, not d_residual's.
/// Returns the frontier after which d_input and d_weight are complete.
/// `dx_ready` (when given) receives the frontier after which d_input alone is complete (see
/// emit_mlp_backward).
/// Throws: ShapeError naming the shapes when the tensors are not laid out alike or the weight
/// is not [1, H]; ValueError when d_input is d_residual.
runtime::Frontier emit_rmsnorm_backward(
    ProgramBuilder& program, runtime::ShardedTensor& input, runtime::ShardedTensor& weight,
    runtime::ShardedTensor& d_out, runtime::ShardedTensor* d_residual,
    runtime::ShardedTensor& d_input, runtime::ShardedTensor& d_weight, RmsNormConstants norm,
    const runtime::Frontier& after, const std::string& name, runtime::Frontier* dx_ready = nullptr);

}  // namespace numesh::ops
