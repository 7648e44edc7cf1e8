#include "numesh/sharding/placement.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "placement_detail.hpp"

namespace numesh::sharding {

using detail::AxisList;
using detail::hash_combine;
using detail::quoted_axis;
using detail::splitters;

// ---------------------------------------------------------------------------------------------
// Placement

std::string_view to_string(PartialOp op) noexcept {
  switch (op) {
    case PartialOp::kSum:
      return "sum";
    case PartialOp::kMax:
      return "max";
  }
  return "?";
}

std::string Placement::to_string() const {
  switch (kind) {
    case Kind::kReplicate:
      return "Replicate()";
    case Kind::kShard:
      return order == 0 ? fmt::format("Shard({})", dim) : fmt::format("Shard({})@{}", dim, order);
    case Kind::kPartial:
      return fmt::format("Partial({})", sharding::to_string(op));
  }
  return "?";
}

bool operator==(const Placement& a, const Placement& b) noexcept {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Placement::Kind::kReplicate:
      return true;
    case Placement::Kind::kShard:
      return a.dim == b.dim && a.order == b.order;
    case Placement::Kind::kPartial:
      return a.op == b.op;
  }
  return false;
}

std::size_t hash_value(const Placement& p) noexcept {
  std::size_t h = static_cast<std::size_t>(p.kind);
  if (p.is_shard()) {
    h = hash_combine(h, std::hash<int>{}(p.dim));
    h = hash_combine(h, std::hash<int>{}(p.order));
  } else if (p.is_partial()) {
    h = hash_combine(h, static_cast<std::size_t>(p.op));
  }
  return h;
}

std::string to_string(const std::vector<Placement>& placements) {
  std::vector<std::string> parts;
  parts.reserve(placements.size());
  for (const Placement& p : placements) parts.push_back(p.to_string());
  return fmt::format("[{}]", fmt::join(parts, ", "));
}

void check_placements(const std::vector<Placement>& placements, const Mesh& mesh) {
  if (placements.size() != mesh.rank()) {
    throw ValueError(fmt::format(
        "sharding: {} placements {} for the {} axes of {}; give one placement per mesh axis",
        placements.size(), to_string(placements), mesh.rank(), mesh.repr()));
  }
  std::map<int, std::vector<std::pair<int, std::size_t>>> by_dim;  // dim -> (order, axis)
  for (std::size_t a = 0; a < placements.size(); ++a) {
    const Placement& p = placements[a];
    if (!p.is_shard()) continue;
    if (p.dim < 0 || p.order < 0) {
      throw ValueError(fmt::format(
          "sharding: mesh axis {} holds {}; a Shard's dim and order must be >= 0 (in {})",
          quoted_axis(mesh, a), p.to_string(), to_string(placements)));
    }
    by_dim[p.dim].emplace_back(p.order, a);
  }
  for (auto& [dim, entries] : by_dim) {
    std::sort(entries.begin(), entries.end());
    bool ok = true;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      ok = ok && entries[i].first == static_cast<int>(i);
    }
    if (ok) continue;
    std::vector<std::string> parts;
    for (const auto& [order, a] : entries) {
      parts.push_back(fmt::format("{} (order {})", quoted_axis(mesh, a), order));
    }
    throw ValueError(fmt::format(
        "sharding: the orders of the mesh axes sharding dim {} must be 0..{}, each once, but "
        "they are {} (in {})",
        dim, entries.size() - 1, fmt::join(parts, ", "), to_string(placements)));
  }
}

std::vector<Placement> to_placements(const PartitionSpec& spec, const Mesh& mesh,
                                     std::size_t rank) {
  if (spec.size() > rank) {
    throw ShapeError(fmt::format("sharding: {} has {} entries but the array has rank {}",
                                 spec.repr(), spec.size(), rank));
  }
  std::vector<Placement> out(mesh.rank(), Placement::replicate());
  std::vector<std::size_t> used_by(mesh.rank(), spec.size());  // dim using the axis, or none
  for (std::size_t d = 0; d < spec.size(); ++d) {
    const AxisRule& entry = spec[d];
    if (entry.is_none()) continue;
    std::vector<AxisRule> members;
    if (entry.is_name()) {
      members.push_back(entry);
    } else if (entry.is_sequence()) {
      members = entry.members();
    } else {
      throw ValueError(fmt::format(
          "sharding: dim {} of {} is {}, which has no placement; an entry must be None, a "
          "mesh axis name or a tuple of names",
          d, spec.repr(), entry.repr()));
    }
    for (std::size_t i = 0; i < members.size(); ++i) {
      const AxisRule& m = members[i];
      if (!m.is_name()) {
        throw ValueError(
            fmt::format("sharding: dim {} of {} holds {} inside {}, which is not a mesh axis name",
                        d, spec.repr(), m.repr(), entry.repr()));
      }
      const std::optional<std::size_t> a = mesh.find_axis(m.name());
      if (!a) {
        throw KeyError(m.name(),
                       fmt::format("sharding: mesh axis {} of {} is not in the mesh {}",
                                   python_repr(m.name()), spec.repr(), mesh.names_repr()));
      }
      if (used_by[*a] != spec.size()) {
        const std::string dims = used_by[*a] == d
                                     ? fmt::format("twice in dim {}", d)
                                     : fmt::format("by dims {} and {}", used_by[*a], d);
        throw DuplicateSpecError(fmt::format(
            "sharding: mesh axis {} is used twice in {} ({}); a mesh axis can split one dim, "
            "once",
            python_repr(m.name()), spec.repr(), dims));
      }
      used_by[*a] = d;
      out[*a] = Placement::shard(static_cast<int>(d), static_cast<int>(i));
    }
  }
  return out;
}

PartitionSpec to_spec(const std::vector<Placement>& placements, const Mesh& mesh,
                      std::size_t rank) {
  check_placements(placements, mesh);
  for (std::size_t a = 0; a < placements.size(); ++a) {
    if (placements[a].is_partial()) {
      throw ValueError(fmt::format(
          "sharding: mesh axis {} holds {}, a pending reduction that a PartitionSpec cannot "
          "express (in {}); reduce it first (plan_reshard to Replicate() or Shard(d))",
          quoted_axis(mesh, a), placements[a].to_string(), to_string(placements)));
    }
    if (placements[a].is_shard() && static_cast<std::size_t>(placements[a].dim) >= rank) {
      throw ShapeError(fmt::format("sharding: mesh axis {} holds {} but the array has rank {}",
                                   quoted_axis(mesh, a), placements[a].to_string(), rank));
    }
  }
  const std::vector<AxisList> lists = splitters(placements, rank);
  std::vector<AxisRule> entries(rank);
  for (std::size_t d = 0; d < rank; ++d) {
    if (lists[d].size() == 1) {
      entries[d] = AxisRule(mesh.names()[lists[d][0]]);
    } else if (lists[d].size() > 1) {
      std::vector<AxisRule> members;
      for (std::size_t a : lists[d]) members.emplace_back(mesh.names()[a]);
      entries[d] = AxisRule::tuple(std::move(members));
    }
  }
  // One spec per placement vector: trailing replicated dims say nothing.
  while (!entries.empty() && entries.back().is_none()) entries.pop_back();
  return PartitionSpec(std::move(entries));
}

}  // namespace numesh::sharding
