#pragma once

// What placement.cpp and reshard_plan.cpp share: private to the sharding library.

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "numesh/sharding/axis_rule.hpp"
#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/placement.hpp"

namespace numesh::sharding::detail {

/// Mesh axes by index.
using AxisList = std::vector<std::size_t>;

/// Boost's hash_combine step.
inline std::size_t hash_combine(std::size_t h, std::size_t v) noexcept {
  return h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
}

/// Mesh axis `a`'s name as Python's repr quotes it ('tp').
inline std::string quoted_axis(const Mesh& mesh, std::size_t a) {
  return python_repr(mesh.names()[a]);
}

/// Per tensor dim, the mesh axes splitting it, major to minor. REQUIRES: check_placements
/// passed, so the orders of each dim are 0..k-1. The result has at least `min_dims` entries.
inline std::vector<AxisList> splitters(const std::vector<Placement>& placements,
                                       std::size_t min_dims = 0) {
  std::size_t dims = min_dims;
  for (const Placement& p : placements) {
    if (p.is_shard()) dims = std::max(dims, static_cast<std::size_t>(p.dim) + 1);
  }
  std::vector<AxisList> lists(dims);
  for (std::size_t a = 0; a < placements.size(); ++a) {
    const Placement& p = placements[a];
    if (!p.is_shard()) continue;
    AxisList& list = lists[static_cast<std::size_t>(p.dim)];
    const auto pos = static_cast<std::size_t>(p.order);
    if (list.size() <= pos) list.resize(pos + 1);
    list[pos] = a;
  }
  return lists;
}

}  // namespace numesh::sharding::detail
