#include "numesh/ops/kernels/routing.hpp"

#include <algorithm>
#include <cmath>

namespace numesh::ops {

void route_tokens(MatrixMap logits, const MoeConfig& c, std::int64_t first_expert, RoutingTables& r,
                  MoeStats& stats) {
  const std::int64_t rows = logits.rows(), e = c.num_experts, k = c.top_k;
  r.first_expert = first_expert;
  for (std::int64_t t = 0; t < rows; ++t) {
    auto row = logits.row(t);
    const float m = row.maxCoeff();
    row = (row.array() - m).exp().matrix();
    row /= row.sum();
    // Top-k: k passes of argmax; strict > keeps the lower index on ties (a stable sort).
    float total = 0.0f;
    for (std::int64_t j = 0; j < k; ++j) {
      std::int64_t best = -1;
      for (std::int64_t ex = 0; ex < e; ++ex) {
        bool taken = false;
        for (std::int64_t p = 0; p < j; ++p)
          taken = taken || r.choice[static_cast<std::size_t>(t * k + p)] == ex;
        if (!taken && (best < 0 || row(ex) > row(best))) best = ex;
      }
      r.choice[static_cast<std::size_t>(t * k + j)] = best;
      r.weight[static_cast<std::size_t>(t * k + j)] = row(best);
      total += row(best);
    }
    if (c.renormalize) {
      for (std::int64_t j = 0; j < k; ++j) r.weight[static_cast<std::size_t>(t * k + j)] /= total;
    }
  }
  const std::int64_t capacity = expert_capacity(c, rows);
  std::fill(r.load.begin(), r.load.end(), 0);
  std::int64_t dropped = 0;
  // GShard's priority: every token's first choice before any second choice.
  for (std::int64_t j = 0; j < k; ++j) {
    for (std::int64_t t = 0; t < rows; ++t) {
      const auto at = static_cast<std::size_t>(t * k + j);
      const auto ex = static_cast<std::size_t>(r.choice[at]);
      const bool keep = capacity == 0 || r.load[ex] < capacity;
      r.kept[at] = keep ? 1 : 0;
      if (keep) {
        ++r.load[ex];
      } else {
        ++dropped;
      }
    }
  }
  std::fill(r.expert_count.begin(), r.expert_count.end(), 0);
  const auto local = static_cast<std::int64_t>(r.expert_count.size());
  for (std::int64_t t = 0; t < rows; ++t) {
    for (std::int64_t j = 0; j < k; ++j) {
      const auto at = static_cast<std::size_t>(t * k + j);
      const std::int64_t le = r.choice[at] - first_expert;
      if (r.kept[at] == 0 || le < 0 || le >= local) continue;
      auto& n = r.expert_count[static_cast<std::size_t>(le)];
      r.expert_rows[static_cast<std::size_t>(le)][static_cast<std::size_t>(n)] = t;
      r.expert_scale[static_cast<std::size_t>(le)][static_cast<std::size_t>(n)] = r.weight[at];
      ++n;
    }
  }
  std::copy(r.load.begin(), r.load.end(), stats.tokens_per_expert.begin());
  stats.dropped = dropped;
  stats.capacity = capacity;
}

}  // namespace numesh::ops
