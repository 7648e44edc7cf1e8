#pragma once

#include "numesh/ops/eigen_views.hpp"
#include "numesh/ops/moe_config.hpp"

// The MoE reference (see reference/mlp.hpp for what the references are).

namespace numesh::ops {

/// MoE forward: probs = softmax(x router) (stable), the top_k experts per token (ties to
/// the lower expert index), their weights (renormalised if asked), capacity as in MoeConfig,
/// and y[t] = sum over kept choices j of weight_tj * swiglu_expert_{e_tj}(x[t]), plus
/// sigmoid(x[t] shared_expert_gate) * shared_expert(x[t]) when the layer has a shared expert.
/// x: [T, H]; returns [T, H]; fills `stats` when given.
/// Throws: ValueError when top_k is not in [1, num_experts] (naming both) or capacity_factor
/// is negative; ShapeError naming the shapes when the weights do not fit x and the config, or
/// the shared expert does not fit (check_shared_expert).
RowMatrix moe_reference(const RowMatrix& x, const MoeWeights& weights, const MoeConfig& config,
                        MoeStats* stats = nullptr);

}  // namespace numesh::ops
