#include "numesh/sharding/sharding_strategy.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "numesh/core/error.hpp"
#include "numesh/sharding/auto_spec.hpp"

namespace numesh::sharding {

namespace {

void require_same_length(const std::vector<NamedLeaf>& leaves,
                         const std::vector<PartitionSpec>& specs, std::string_view fn) {
  if (leaves.size() != specs.size()) {
    throw ValueError(
        fmt::format("{}: {} leaves but {} partition specs; the two trees must have "
                    "the same structure",
                    fn, leaves.size(), specs.size()));
  }
}

}  // namespace

std::string python_shape_repr(const std::vector<std::int64_t>& shape) {
  if (shape.size() == 1) return fmt::format("({},)", shape[0]);
  return fmt::format("({})", fmt::join(shape, ", "));
}

std::string jax_keypath_repr(std::string_view path) {
  std::vector<std::string> keys;
  if (!path.empty()) {
    std::size_t start = 0;
    while (true) {
      const std::size_t slash = path.find('/', start);
      const std::string_view part = path.substr(
          start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
      const bool index = !part.empty() && std::all_of(part.begin(), part.end(), [](char ch) {
        return std::isdigit(static_cast<unsigned char>(ch)) != 0;
      });
      keys.push_back(index ? fmt::format("SequenceKey(idx={})", part)
                           : fmt::format("DictKey(key={})", python_repr(part)));
      if (slash == std::string_view::npos) break;
      start = slash + 1;
    }
  }
  if (keys.size() == 1) return fmt::format("({},)", keys[0]);
  return fmt::format("({})", fmt::join(keys, ", "));
}

std::vector<PartitionSpec> optimize_sharding_for_memory(
    const std::vector<NamedLeaf>& leaves, const std::optional<Mesh>& mesh_arg,
    std::optional<std::int64_t> max_memory_per_device,
    const std::optional<std::vector<AxisRule>>& names_arg) {
  const Mesh& mesh = mesh_or_current(mesh_arg);
  std::vector<AxisRule> names;
  if (names_arg) {
    names = *names_arg;
  } else {
    for (const auto& n : mesh.names()) names.emplace_back(n);
  }
  std::vector<PartitionSpec> out;
  out.reserve(leaves.size());
  for (const NamedLeaf& leaf : leaves) {
    const ArrayInfo& array = leaf.require_array();
    if (!max_memory_per_device || array.nbytes() < *max_memory_per_device) {
      out.emplace_back();
    } else {
      out.push_back(auto_partition_spec(array, mesh, names));
    }
  }
  return out;
}

NamedSpecs convert_sharding_strategy(const ArrayInfo& array, const NamedSpecs& old_specs,
                                     const Mesh& old_mesh, const Mesh& new_mesh,
                                     std::string_view strategy) {
  NamedSpecs out;
  if (strategy != "preserve_balance") return out;  // eformer: unknown strategies yield {}
  for (const auto& [name, spec] : old_specs) {
    std::int64_t factor = 1;
    for (const AxisRule& entry : spec) {
      if (!entry.is_none()) factor *= entry_mesh_size(old_mesh, entry);
    }
    out.emplace_back(name, auto_partition_spec(array, new_mesh, std::nullopt, factor));
  }
  return out;
}

std::vector<std::string> validate_sharding_config(const std::vector<NamedLeaf>& leaves,
                                                  const std::vector<PartitionSpec>& specs,
                                                  const std::optional<Mesh>& mesh_arg) {
  const Mesh& mesh = mesh_or_current(mesh_arg);
  require_same_length(leaves, specs, "validate_sharding_config");
  std::vector<std::string> issues;
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    const ArrayInfo& array = leaves[i].require_array();
    const PartitionSpec& spec = specs[i];
    const std::string path = jax_keypath_repr(leaves[i].path);
    for (std::size_t d = 0; d < spec.size(); ++d) {
      if (spec[d].is_none()) continue;
      if (d >= array.shape.size()) throw IndexError("tuple index out of range");
      const std::int64_t size = entry_mesh_size(mesh, spec[d]);
      if (size == 0 || array.shape[d] % size != 0) {
        issues.push_back(
            fmt::format("Array at {} with shape {} not divisible by mesh axis {} size {}", path,
                        python_shape_repr(array.shape), spec[d].str(), size));
      }
    }
    if (array.size() < 1024 && !spec.empty()) {
      issues.push_back(fmt::format("Small array at {} might not benefit from sharding", path));
    }
  }
  return issues;
}

ShardingAnalysis analyze_sharding_strategy(const std::vector<NamedLeaf>& leaves,
                                           const std::vector<PartitionSpec>& specs,
                                           const std::optional<Mesh>& mesh_arg) {
  const Mesh& mesh = mesh_or_current(mesh_arg);
  require_same_length(leaves, specs, "analyze_sharding_strategy");
  ShardingAnalysis out;
  const std::int64_t devices = mesh.size();
  out.memory_per_device.assign(static_cast<std::size_t>(std::max<std::int64_t>(devices, 0)), 0);
  std::vector<std::int64_t> usage(mesh.rank(), 0);
  std::vector<std::vector<std::int64_t>> coords;
  for (std::int64_t dev = 0; dev < devices; ++dev) coords.push_back(mesh.coords_of(dev));

  for (std::size_t i = 0; i < leaves.size(); ++i) {
    const ArrayInfo& array = leaves[i].require_array();
    const PartitionSpec& spec = specs[i];
    out.total_parameters += array.size();
    if (!spec.empty()) out.sharded_parameters += array.size();

    // Mesh axis indices splitting each dim, major to minor (a tuple entry's first member is
    // the major one, as in JAX).
    std::vector<std::vector<std::size_t>> dim_axes(array.shape.size());
    std::vector<bool> used(mesh.rank(), false);
    for (std::size_t d = 0; d < spec.size(); ++d) {
      if (spec[d].is_none()) continue;
      (void)entry_mesh_size(mesh, spec[d]);  // KeyError / TypeError before the rank check
      if (d >= array.shape.size()) {
        throw ValueError(
            fmt::format("spec {} of leaf '{}' shards dim {}, but the array has rank {}",
                        spec.repr(), leaves[i].path, d, array.shape.size()));
      }
      for (const std::string& name : spec.entry_names(d)) {
        const std::size_t axis = *mesh.find_axis(name);
        dim_axes[d].push_back(axis);
        used[axis] = true;
      }
    }
    const bool sharded = std::any_of(dim_axes.begin(), dim_axes.end(),
                                     [](const auto& axes) { return !axes.empty(); });
    ++out.partition_stats.leaves;
    ++(sharded ? out.partition_stats.sharded_leaves : out.partition_stats.replicated_leaves);
    for (std::size_t a = 0; a < used.size(); ++a) usage[a] += used[a] ? 1 : 0;

    const std::int64_t itemsize = array.itemsize();
    for (std::int64_t dev = 0; dev < devices; ++dev) {
      std::int64_t bytes = itemsize;
      for (std::size_t d = 0; d < array.shape.size(); ++d) {
        const std::int64_t extent = array.shape[d];
        std::int64_t shards = 1, index = 0;
        for (std::size_t axis : dim_axes[d]) {
          shards *= mesh.sizes()[axis];
          index = index * mesh.sizes()[axis] + coords[static_cast<std::size_t>(dev)][axis];
        }
        const std::int64_t chunk = (extent + shards - 1) / shards;
        bytes *= std::clamp<std::int64_t>(extent - index * chunk, 0, chunk);
      }
      out.memory_per_device[static_cast<std::size_t>(dev)] += bytes;
    }
  }

  for (std::size_t a = 0; a < mesh.rank(); ++a) {
    out.partition_stats.axis_usage.emplace_back(mesh.names()[a], usage[a]);
  }
  if (!out.memory_per_device.empty()) {
    const auto [lo, hi] =
        std::minmax_element(out.memory_per_device.begin(), out.memory_per_device.end());
    out.balance_score = *hi == 0 ? 1.0 : static_cast<double>(*lo) / static_cast<double>(*hi);
  }
  return out;
}

}  // namespace numesh::sharding
