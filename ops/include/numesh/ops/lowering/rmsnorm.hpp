#pragma once

#include <string>

#include "numesh/ops/lowering/program.hpp"
#include "numesh/runtime/collectives.hpp"
#include "numesh/runtime/tensor.hpp"

// RMSNorm on the mesh, fused with the residual add that precedes it in a transformer block:
// one node per device over its rows, no collective (the hidden dim is whole on every device).

namespace numesh::ops {

/// Emits out = rmsnorm(a + b) .* weight per row of each device's shards: the residual add
/// (when `b` is given), the sum also kept in `sum` (when given), then the norm (when `weight`
/// is given; otherwise out = a + b). With b null: out = rmsnorm(a) .* weight. One node per
/// device, after `after`; 4 FLOPs per element for the norm, 1 more for the add.
/// REQUIRES: a, b, sum and out laid out alike ([rows, H] per device, H whole), weight [1, H]
/// replicated; not both b and weight null.
/// Returns the frontier after which out (and sum) are complete.
runtime::Frontier emit_residual_rmsnorm(ProgramBuilder& program, runtime::ShardedTensor& a,
                                        runtime::ShardedTensor* b, runtime::ShardedTensor* weight,
                                        runtime::ShardedTensor* sum, runtime::ShardedTensor& out, float eps,
                                        const runtime::Frontier& after, const std::string& name);

}  // namespace numesh::ops
