#include "numesh/ops/moe_config.hpp"

#include <algorithm>
#include <cmath>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "shape_text.hpp"

namespace numesh::ops {

void check_moe_config(const MoeConfig& c) {
  const std::int64_t e = c.num_experts, k = c.top_k;
  NUMESH_CHECK(e >= 1 && k >= 1 && k <= e, ValueError,
               "moe: top_k {} must be between 1 and the {} experts", k, e);
  NUMESH_CHECK(std::isfinite(c.capacity_factor), ValueError,
               "moe: capacity_factor {} is not finite", c.capacity_factor);
  NUMESH_CHECK(c.capacity_factor >= 0.0f, ValueError, "moe: capacity_factor {} is negative",
               c.capacity_factor);
}

std::int64_t expert_capacity(const MoeConfig& c, std::int64_t rows) {
  if (c.capacity_factor <= 0.0f) return 0;
  const double wanted =
      std::ceil(static_cast<double>(c.capacity_factor) * static_cast<double>(rows) *
                static_cast<double>(c.top_k) / static_cast<double>(c.num_experts));
  // Past rows * top_k nothing is dropped; the bound only keeps the cast defined.
  constexpr double kNoLimit = 4611686018427387904.0;  // 2^62
  return static_cast<std::int64_t>(std::min(wanted, kNoLimit));
}

void check_shared_expert(const MoeWeights& w, std::int64_t hidden) {
  using detail::shape_text;
  const MlpWeights& s = w.shared_expert;
  if (!w.has_shared_expert()) {
    NUMESH_CHECK(s.gate.shape.empty() && s.down.shape.empty() && w.shared_expert_gate.shape.empty(),
                 ShapeError,
                 "moe: shared expert gate {}, down {} and shared_expert_gate {} given without its "
                 "up projection",
                 shape_text(s.gate), shape_text(s.down), shape_text(w.shared_expert_gate));
    return;
  }
  const std::int64_t fs = s.up.shape.size() == 2 ? s.up.shape[1] : -1;
  NUMESH_CHECK(fs > 0 && s.up.shape == (std::vector<std::int64_t>{hidden, fs}) &&
                   s.gate.shape == s.up.shape &&
                   s.down.shape == (std::vector<std::int64_t>{fs, hidden}),
               ShapeError,
               "moe: shared expert gate {}, up {}, down {} do not fit hidden {} (expected [H, Fs], "
               "[H, Fs], [Fs, H])",
               shape_text(s.gate), shape_text(s.up), shape_text(s.down), hidden);
  NUMESH_CHECK(w.shared_expert_gate.shape == (std::vector<std::int64_t>{hidden, 1}), ShapeError,
               "moe: shared_expert_gate is {}, expected [{}, 1]", shape_text(w.shared_expert_gate),
               hidden);
  // Qwen2-MoE's shared expert has none; the fused lowering does not add them.
  NUMESH_CHECK(
      s.gate_bias.shape.empty() && s.up_bias.shape.empty() && s.down_bias.shape.empty(), ShapeError,
      "moe: the shared expert has biases (gate {}, up {}, down {}); numesh runs it without",
      shape_text(s.gate_bias), shape_text(s.up_bias), shape_text(s.down_bias));
}

}  // namespace numesh::ops
