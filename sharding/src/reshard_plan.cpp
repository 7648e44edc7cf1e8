#include "numesh/sharding/reshard_plan.hpp"

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

namespace {

std::vector<std::string> axis_names(const Mesh& mesh, const AxisList& axes) {
  std::vector<std::string> names;
  names.reserve(axes.size());
  for (std::size_t a : axes) names.push_back(mesh.names()[a]);
  return names;
}

// The index of the first position where `a` and `b` differ (their common length if none).
std::size_t first_difference(const AxisList& a, const AxisList& b) {
  std::size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ReshardStep

ReshardStep ReshardStep::all_reduce(std::vector<std::string> axes, PartialOp op) {
  return ReshardStep{Kind::kAllReduce, std::move(axes), kNoDim, kNoDim, op};
}

ReshardStep ReshardStep::reduce_scatter(std::vector<std::string> axes, int dim, PartialOp op) {
  return ReshardStep{Kind::kReduceScatter, std::move(axes), kNoDim, dim, op};
}

ReshardStep ReshardStep::all_gather(std::vector<std::string> axes, int dim) {
  return ReshardStep{Kind::kAllGather, std::move(axes), dim, kNoDim, PartialOp::kSum};
}

ReshardStep ReshardStep::all_to_all(std::vector<std::string> axes, int from_dim, int to_dim) {
  return ReshardStep{Kind::kAllToAll, std::move(axes), from_dim, to_dim, PartialOp::kSum};
}

ReshardStep ReshardStep::local_slice(std::vector<std::string> axes, int dim) {
  return ReshardStep{Kind::kLocalSlice, std::move(axes), kNoDim, dim, PartialOp::kSum};
}

std::string ReshardStep::to_string() const {
  const std::string names = fmt::format("[{}]", fmt::join(axes, ","));
  switch (kind) {
    case Kind::kAllReduce:
      return fmt::format("AllReduce({}, axes={})", sharding::to_string(op), names);
    case Kind::kReduceScatter:
      return fmt::format("ReduceScatter({}, dim={}, axes={})", sharding::to_string(op), to_dim,
                         names);
    case Kind::kAllGather:
      return fmt::format("AllGather(dim={}, axes={})", from_dim, names);
    case Kind::kAllToAll:
      return fmt::format("AllToAll(dim={}->{}, axes={})", from_dim, to_dim, names);
    case Kind::kLocalSlice:
      return fmt::format("LocalSlice(dim={}, axes={})", to_dim, names);
  }
  return "?";
}

std::size_t hash_value(const ReshardStep& step) noexcept {
  std::size_t h = static_cast<std::size_t>(step.kind);
  for (const std::string& a : step.axes) h = hash_combine(h, std::hash<std::string>{}(a));
  h = hash_combine(h, std::hash<int>{}(step.from_dim));
  h = hash_combine(h, std::hash<int>{}(step.to_dim));
  return hash_combine(h, static_cast<std::size_t>(step.op));
}

std::string to_string(const std::vector<ReshardStep>& plan) {
  std::vector<std::string> parts;
  parts.reserve(plan.size());
  for (const ReshardStep& s : plan) parts.push_back(s.to_string());
  return fmt::format("[{}]", fmt::join(parts, "; "));
}

// ---------------------------------------------------------------------------------------------
// apply_reshard_step

std::vector<Placement> apply_reshard_step(const std::vector<Placement>& placements,
                                          const ReshardStep& step, const Mesh& mesh) {
  check_placements(placements, mesh);
  const std::string where =
      fmt::format("sharding: cannot apply {} to {}", step.to_string(), to_string(placements));
  if (step.axes.empty()) throw ValueError(where + ": the step names no mesh axis");
  AxisList axes;
  for (const std::string& name : step.axes) {
    const std::optional<std::size_t> a = mesh.find_axis(name);
    if (!a) {
      throw KeyError(name, fmt::format("{}: mesh axis {} is not in the mesh {}", where,
                                       python_repr(name), mesh.names_repr()));
    }
    if (std::find(axes.begin(), axes.end(), *a) != axes.end()) {
      throw ValueError(fmt::format("{}: mesh axis {} is listed twice", where, python_repr(name)));
    }
    axes.push_back(*a);
  }
  const auto check_dim = [&](int dim, std::string_view which) {
    if (dim < 0) throw ValueError(fmt::format("{}: {} must be >= 0, got {}", where, which, dim));
  };
  const auto check_each = [&](std::string_view wanted, auto&& ok) {
    for (std::size_t a : axes) {
      if (!ok(placements[a])) {
        throw ValueError(fmt::format("{}: mesh axis {} holds {}, not {}", where,
                                     quoted_axis(mesh, a), placements[a].to_string(), wanted));
      }
    }
  };
  const std::vector<AxisList> lists = splitters(placements);
  const auto splitters_of = [&](int dim) {
    const auto d = static_cast<std::size_t>(dim);
    return d < lists.size() ? lists[d] : AxisList{};
  };
  // The last axes.size() splitters of `dim`, or nullopt when there are fewer.
  const auto minor_suffix = [&](int dim) -> std::optional<AxisList> {
    const AxisList list = splitters_of(dim);
    if (list.size() < axes.size()) return std::nullopt;
    return AxisList(list.end() - static_cast<std::ptrdiff_t>(axes.size()), list.end());
  };
  const auto suffix_error = [&](int dim) {
    const AxisList list = splitters_of(dim);
    return ValueError(fmt::format(
        "{}: the axes must be the minor-most mesh axes splitting dim {}{}; dim {} is split by "
        "[{}], major to minor",
        where, dim,
        step.kind == ReshardStep::Kind::kAllToAll && step.from_dim == step.to_dim
            ? " (in any order)"
            : ", in order",
        dim, fmt::join(axis_names(mesh, list), ",")));
  };
  // Appends `axes` as the minor-most splitters of `dim` (after `base` existing ones).
  std::vector<Placement> out = placements;
  const auto append_to = [&](int dim, std::size_t base) {
    for (std::size_t i = 0; i < axes.size(); ++i) {
      out[axes[i]] = Placement::shard(dim, static_cast<int>(base + i));
    }
  };

  switch (step.kind) {
    case ReshardStep::Kind::kLocalSlice:
      check_dim(step.to_dim, "to_dim");
      check_each("Replicate()", [](const Placement& p) { return p.is_replicate(); });
      append_to(step.to_dim, splitters_of(step.to_dim).size());
      break;
    case ReshardStep::Kind::kReduceScatter:
    case ReshardStep::Kind::kAllReduce: {
      const std::string wanted = Placement::partial(step.op).to_string();
      check_each(wanted, [&](const Placement& p) { return p == Placement::partial(step.op); });
      if (step.kind == ReshardStep::Kind::kAllReduce) {
        for (std::size_t a : axes) out[a] = Placement::replicate();
      } else {
        check_dim(step.to_dim, "to_dim");
        append_to(step.to_dim, splitters_of(step.to_dim).size());
      }
      break;
    }
    case ReshardStep::Kind::kAllGather: {
      check_dim(step.from_dim, "from_dim");
      if (minor_suffix(step.from_dim) != axes) throw suffix_error(step.from_dim);
      for (std::size_t a : axes) out[a] = Placement::replicate();
      break;
    }
    case ReshardStep::Kind::kAllToAll: {
      check_dim(step.from_dim, "from_dim");
      check_dim(step.to_dim, "to_dim");
      const std::optional<AxisList> suffix = minor_suffix(step.from_dim);
      if (step.from_dim != step.to_dim) {
        if (suffix != axes) throw suffix_error(step.from_dim);
        append_to(step.to_dim, splitters_of(step.to_dim).size());
      } else {
        AxisList sorted_axes = axes;
        AxisList sorted_suffix = suffix.value_or(AxisList{});
        std::sort(sorted_axes.begin(), sorted_axes.end());
        std::sort(sorted_suffix.begin(), sorted_suffix.end());
        if (!suffix || sorted_axes != sorted_suffix) throw suffix_error(step.from_dim);
        append_to(step.to_dim, splitters_of(step.to_dim).size() - axes.size());
      }
      break;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// plan_reshard

namespace {

// Refuses pending reductions of different kinds in `from` and a target that creates or changes
// one. Returns the pending reductions' kind (sum when none is pending).
PartialOp check_reshard_partials(const std::vector<Placement>& from,
                                 const std::vector<Placement>& to, const Mesh& mesh) {
  std::optional<std::size_t> partial_axis;
  for (std::size_t a = 0; a < from.size(); ++a) {
    if (!from[a].is_partial()) continue;
    if (partial_axis && from[*partial_axis].op != from[a].op) {
      throw ValueError(fmt::format(
          "sharding: mesh axes {} and {} hold {} and {} in {}; pending reductions of different "
          "kinds have no defined order, reduce one of them first",
          quoted_axis(mesh, *partial_axis), quoted_axis(mesh, a), from[*partial_axis].to_string(),
          from[a].to_string(), to_string(from)));
    }
    partial_axis = a;
  }
  for (std::size_t a = 0; a < to.size(); ++a) {
    if (to[a].is_partial() && from[a] != to[a]) {
      throw ValueError(fmt::format(
          "sharding: cannot reshard mesh axis {} from {} to {}: a reshard can keep a pending "
          "reduction but never create or change one ({} -> {})",
          quoted_axis(mesh, a), from[a].to_string(), to[a].to_string(), to_string(from),
          to_string(to)));
    }
  }
  return partial_axis ? from[*partial_axis].op : PartialOp::kSum;
}

// A plan under construction: the steps so far and the placements they reach, with the phases
// plan_reshard runs in order.
struct ReshardPlanner {
  const std::vector<Placement>& to;
  const Mesh& mesh;
  PartialOp op;
  std::size_t dims;
  std::vector<AxisList> target;  // to's splitters of each dim
  std::vector<Placement> cur;
  std::vector<ReshardStep> plan;

  // Appends `step` and applies it to cur.
  void emit(ReshardStep step) {
    cur = apply_reshard_step(cur, step, mesh);
    plan.push_back(std::move(step));
  }
  // The axes splitting dim d now, major to minor.
  AxisList current(std::size_t d) const { return splitters(cur, dims)[d]; }
  // True when axis a splits dim d in the target too.
  bool stays_on(std::size_t a, std::size_t d) const {
    return to[a].is_shard() && static_cast<std::size_t>(to[a].dim) == d;
  }
  // A change of order on `d` from `now` to `wanted` (same axes): the axes from the first
  // position that changes.
  void reorder(std::size_t d, const AxisList& now, const AxisList& wanted) {
    NUMESH_DCHECK(now.size() == wanted.size());
    if (now == wanted) return;
    const AxisList tail(wanted.begin() + static_cast<std::ptrdiff_t>(first_difference(now, wanted)),
                        wanted.end());
    emit(ReshardStep::all_to_all(axis_names(mesh, tail), static_cast<int>(d), static_cast<int>(d)));
  }

  // 1. Local slices: Replicate -> Shard(d), appended in the target's order.
  void slice_locally() {
    for (std::size_t d = 0; d < dims; ++d) {
      AxisList axes;
      for (std::size_t a : target[d]) {
        if (cur[a].is_replicate()) axes.push_back(a);
      }
      if (!axes.empty())
        emit(ReshardStep::local_slice(axis_names(mesh, axes), static_cast<int>(d)));
    }
  }

  // 2. Reductions: reduce-scatters (Partial -> Shard(d)), then all-reduces on what is left.
  void reduce() {
    for (std::size_t d = 0; d < dims; ++d) {
      AxisList axes;
      for (std::size_t a : target[d]) {
        if (cur[a].is_partial()) axes.push_back(a);
      }
      if (!axes.empty()) {
        emit(ReshardStep::reduce_scatter(axis_names(mesh, axes), static_cast<int>(d), op));
      }
    }
    AxisList axes;
    for (std::size_t a = 0; a < cur.size(); ++a) {
      if (cur[a].is_partial() && to[a].is_replicate()) axes.push_back(a);
    }
    if (!axes.empty()) emit(ReshardStep::all_reduce(axis_names(mesh, axes), op));
  }

  // 3. All-to-alls out of each dim. The moving axes must be the minor-most splitters, grouped
  //    by destination; when they are not, reorder the dim first: the axes staying in their
  //    target order, then those to gather, then the moving ones by destination.
  void move_between_dims() {
    for (std::size_t d = 0; d < dims; ++d) move_out_of(d);
  }

  // Step 3 on dim d.
  void move_out_of(std::size_t d) {
    const AxisList now = current(d);
    AxisList moving;
    for (std::size_t a : now) {
      if (to[a].is_shard() && !stays_on(a, d)) moving.push_back(a);
    }
    if (moving.empty()) return;
    const auto dest = [&](std::size_t a) { return to[a].dim; };
    const AxisList suffix(now.end() - static_cast<std::ptrdiff_t>(moving.size()), now.end());
    // Grouped: no destination reappears after another one.
    bool grouped = suffix == moving;
    std::vector<int> seen;
    for (std::size_t i = 0; grouped && i < moving.size(); ++i) {
      if (i > 0 && dest(moving[i]) == dest(moving[i - 1])) continue;
      grouped = std::find(seen.begin(), seen.end(), dest(moving[i])) == seen.end();
      seen.push_back(dest(moving[i]));
    }
    if (!grouped) {
      AxisList wanted;
      for (std::size_t a : target[d]) {
        if (std::find(now.begin(), now.end(), a) != now.end()) wanted.push_back(a);
      }
      for (std::size_t a : now) {
        if (to[a].is_replicate()) wanted.push_back(a);
      }
      AxisList by_dest = moving;
      std::stable_sort(by_dest.begin(), by_dest.end(),
                       [&](std::size_t x, std::size_t y) { return dest(x) < dest(y); });
      wanted.insert(wanted.end(), by_dest.begin(), by_dest.end());
      reorder(d, now, wanted);
    }
    // Send the minor-most group first, until no moving axis is left on d.
    for (AxisList list = current(d);
         !list.empty() && to[list.back()].is_shard() && !stays_on(list.back(), d);
         list = current(d)) {
      const int e = dest(list.back());
      AxisList group;
      while (!list.empty() && to[list.back()].is_shard() && dest(list.back()) == e) {
        group.insert(group.begin(), list.back());
        list.pop_back();
      }
      emit(ReshardStep::all_to_all(axis_names(mesh, group), static_cast<int>(d), e));
    }
  }

  // 4. Each dim in its target order, followed by the axes to gather.
  void order_dims() {
    for (std::size_t d = 0; d < dims; ++d) {
      const AxisList now = current(d);
      AxisList wanted = target[d];
      for (std::size_t a : now) {
        if (to[a].is_replicate()) wanted.push_back(a);
      }
      reorder(d, now, wanted);
    }
  }

  // 5. All-gathers last.
  void gather() {
    for (std::size_t d = 0; d < dims; ++d) {
      AxisList axes;
      for (std::size_t a : current(d)) {
        if (to[a].is_replicate()) axes.push_back(a);
      }
      if (!axes.empty()) emit(ReshardStep::all_gather(axis_names(mesh, axes), static_cast<int>(d)));
    }
  }
};

}  // namespace

std::vector<ReshardStep> plan_reshard(const std::vector<Placement>& from,
                                      const std::vector<Placement>& to, const Mesh& mesh) {
  check_placements(from, mesh);
  check_placements(to, mesh);
  const PartialOp op = check_reshard_partials(from, to, mesh);
  const std::size_t dims = std::max(splitters(from).size(), splitters(to).size());
  ReshardPlanner planner{.to = to,
                         .mesh = mesh,
                         .op = op,
                         .dims = dims,
                         .target = splitters(to, dims),
                         .cur = from,
                         .plan = {}};
  planner.slice_locally();
  planner.reduce();
  planner.move_between_dims();
  planner.order_dims();
  planner.gather();
  NUMESH_DCHECK(planner.cur == to);
  return std::move(planner.plan);
}

}  // namespace numesh::sharding
