#pragma once

#include <cstdint>
#include <vector>

#include "numesh/ops/eigen_views.hpp"
#include "numesh/ops/moe_config.hpp"

// MoE routing on one group of tokens, no mesh: the kernel every device's route node runs.

namespace numesh::ops {

/// The routing tables of one routing group's tokens, sized once (at emit time) so that
/// route_tokens() never allocates.
struct RoutingTables {
  /// Tables for `rows` tokens, top-`k` of `experts`, of which `local_experts` are computed here.
  RoutingTables(std::int64_t rows, std::int64_t k, std::int64_t experts, std::int64_t local_experts)
      : choice(static_cast<std::size_t>(rows * k)),
        weight(static_cast<std::size_t>(rows * k)),
        kept(static_cast<std::size_t>(rows * k)),
        load(static_cast<std::size_t>(experts)),
        expert_rows(static_cast<std::size_t>(local_experts),
                    std::vector<std::int64_t>(static_cast<std::size_t>(rows))),
        expert_scale(static_cast<std::size_t>(local_experts),
                     std::vector<float>(static_cast<std::size_t>(rows))),
        expert_count(static_cast<std::size_t>(local_experts)) {}
  std::vector<std::int64_t> choice;                    // [rows, k]: chosen experts, best first
  std::vector<float> weight;                           // [rows, k]
  std::vector<char> kept;                              // [rows, k]: within capacity
  std::vector<std::int64_t> load;                      // [E]
  std::vector<std::vector<std::int64_t>> expert_rows;  // per local expert: its rows, token order
  std::vector<std::vector<float>> expert_scale;        // per local expert: the routing weights
  std::vector<std::int64_t> expert_count;
  std::int64_t first_expert = 0;  // the global index of local expert 0 (route_tokens' argument)
};

/// Router softmax (fp32, stable), top-k (ties to the lower expert index), the routing weights
/// (renormalised when config.renormalize), capacity in GShard's priority order (every token's
/// first choice before any second), and the row lists of the local experts [first_expert,
/// first_expert + local_experts) for `rows` tokens whose router logits are in `logits` [rows,
/// E] (overwritten with the probabilities): the decisions moe_reference makes, without
/// allocating. Fills `stats` (tokens_per_expert must hold E entries).
/// REQUIRES: tables sized for logits.rows() tokens and config's k and E.
void route_tokens(MatrixMap logits, const MoeConfig& config, std::int64_t first_expert,
                  RoutingTables& tables, MoeStats& stats);

}  // namespace numesh::ops
