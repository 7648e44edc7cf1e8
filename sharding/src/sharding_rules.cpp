#include "numesh/sharding/sharding_rules.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "numesh/core/error.hpp"
#include "numesh/sharding/auto_spec.hpp"
#include "numesh/sharding/sharding_strategy.hpp"

namespace numesh::sharding {

namespace {

std::vector<std::string> names_or_mesh(std::optional<std::vector<std::string>> names,
                                       const Mesh& mesh) {
  if (names && !names->empty()) return std::move(*names);
  return mesh.names();
}

// Dim indices by extent descending (ascending when `ascending`), ties in index order.
std::vector<std::size_t> dim_order(const std::vector<std::int64_t>& shape, bool ascending) {
  std::vector<std::size_t> order(shape.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return ascending ? shape[a] < shape[b] : shape[a] > shape[b];
  });
  return order;
}

void require_same_length(std::size_t leaves, std::size_t specs, std::string_view fn) {
  if (leaves != specs) {
    throw ValueError(
        fmt::format("{}: {} leaves but {} partition specs; the two trees must have "
                    "the same structure",
                    fn, leaves, specs));
  }
}

}  // namespace

// ---- AutoShardingRule -----------------------------------------------------------------------

AutoShardingRule::AutoShardingRule(const std::optional<Mesh>& mesh,
                                   std::optional<std::vector<std::string>> axis_names,
                                   std::optional<std::int64_t> min_shard_size, bool reverse)
    : mesh_(mesh_or_current(mesh)),
      axis_names_(names_or_mesh(std::move(axis_names), mesh_)),
      min_shard_size_(min_shard_size.value_or(0) != 0 ? *min_shard_size : mesh_.size()),
      reverse_(reverse) {
  // eformer iterates set(axis_names): drop duplicates, keeping first occurrences in order.
  std::vector<std::string> unique;
  for (auto& n : axis_names_) {
    if (std::find(unique.begin(), unique.end(), n) == unique.end()) unique.push_back(n);
  }
  axis_names_ = std::move(unique);
}

PartitionSpec AutoShardingRule::spec_for(const std::vector<std::int64_t>& shape) const {
  std::int64_t elements = 1;
  for (std::int64_t d : shape) elements *= d;
  if (elements < min_shard_size_) return {};
  std::vector<AxisRule> entries(shape.size());
  std::vector<std::string> remaining = axis_names_;
  for (std::size_t d : dim_order(shape, reverse_)) {
    for (auto it = remaining.begin(); it != remaining.end(); ++it) {
      const std::int64_t size = mesh_.axis_size(*it);
      if (size != 0 && shape[d] % size == 0) {
        if (!it->empty()) {  // eformer's `if best_axis:`
          entries[d] = AxisRule(*it);
          remaining.erase(it);
        }
        break;
      }
    }
    if (remaining.empty()) break;
  }
  return PartitionSpec(std::move(entries));
}

std::vector<PartitionSpec> AutoShardingRule::apply(const std::vector<NamedLeaf>& leaves) const {
  std::vector<PartitionSpec> out;
  out.reserve(leaves.size());
  for (const NamedLeaf& leaf : leaves) out.push_back(spec_for(leaf.require_array().shape));
  return out;
}

// ---- MemoryConstrainedShardingRule ----------------------------------------------------------

MemoryConstrainedShardingRule::MemoryConstrainedShardingRule(
    std::int64_t max_memory_per_device, const std::optional<Mesh>& mesh,
    std::optional<std::vector<std::string>> axis_names)
    : max_memory_per_device_(max_memory_per_device),
      mesh_(mesh_or_current(mesh)),
      axis_names_(names_or_mesh(std::move(axis_names), mesh_)) {}

PartitionSpec MemoryConstrainedShardingRule::spec_for(const ArrayInfo& array) const {
  std::int64_t remaining = array.nbytes();
  if (remaining <= max_memory_per_device_) return {};

  // sorted(axis_names, key=mesh size, reverse=True) is stable: equal sizes keep their order.
  std::vector<std::pair<std::string, std::int64_t>> axes;
  for (const auto& n : axis_names_) axes.emplace_back(n, mesh_.axis_size(n));
  std::stable_sort(axes.begin(), axes.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });

  std::vector<AxisRule> entries(array.shape.size());
  for (std::size_t d : dim_order(array.shape, /*ascending=*/false)) {
    if (remaining <= max_memory_per_device_) break;
    for (auto it = axes.begin(); it != axes.end(); ++it) {
      if (it->second != 0 && array.shape[d] % it->second == 0) {
        entries[d] = AxisRule(it->first);
        remaining /= it->second;
        axes.erase(it);
        break;
      }
    }
  }
  return PartitionSpec(std::move(entries));
}

std::vector<PartitionSpec> MemoryConstrainedShardingRule::apply(
    const std::vector<NamedLeaf>& leaves) const {
  std::vector<PartitionSpec> out;
  out.reserve(leaves.size());
  for (const NamedLeaf& leaf : leaves) out.push_back(spec_for(leaf.require_array()));
  return out;
}

// ---- ShapeBasedShardingRule -----------------------------------------------------------------

ShapeBasedShardingRule::ShapeBasedShardingRule(
    std::vector<std::pair<ShapePattern, PartitionSpec>> patterns)
    : patterns_(std::move(patterns)) {}

std::vector<PartitionSpec> ShapeBasedShardingRule::apply(
    const std::vector<NamedLeaf>& leaves) const {
  std::vector<PartitionSpec> out;
  out.reserve(leaves.size());
  for (const NamedLeaf& leaf : leaves) {
    const auto& shape = leaf.require_array().shape;
    auto match = std::find_if(patterns_.begin(), patterns_.end(), [&](const auto& p) {
      if (p.first.size() != shape.size()) return false;
      for (std::size_t d = 0; d < shape.size(); ++d) {
        if (p.first[d] && *p.first[d] != shape[d]) return false;
      }
      return true;
    });
    out.push_back(match == patterns_.end() ? PartitionSpec() : match->second);
  }
  return out;
}

// ---- CompositeShardingRule ------------------------------------------------------------------

CompositeShardingRule::CompositeShardingRule(std::vector<std::shared_ptr<const ShardingRule>> rules)
    : rules_(std::move(rules)) {}

std::vector<PartitionSpec> CompositeShardingRule::apply(
    const std::vector<NamedLeaf>& leaves) const {
  std::vector<PartitionSpec> out(leaves.size());
  std::vector<bool> chosen(leaves.size(), false);
  for (const auto& rule : rules_) {  // eformer applies every rule, so every rule's errors surface
    const auto specs = rule->apply(leaves);
    for (std::size_t i = 0; i < leaves.size(); ++i) {
      if (!chosen[i] && !specs.at(i).empty()) {
        out[i] = specs[i];
        chosen[i] = true;
      }
    }
  }
  return out;
}

// ---- ShardingAnalyzer -----------------------------------------------------------------------

ShardingAnalyzer::ShardingAnalyzer(const std::optional<Mesh>& mesh)
    : mesh_(mesh_or_current(mesh)) {}

std::vector<std::string> ShardingAnalyzer::validate_partition_specs(
    const std::vector<NamedLeaf>& leaves, const std::vector<PartitionSpec>& specs) const {
  require_same_length(leaves.size(), specs.size(), "validate_partition_specs");
  std::vector<std::string> issues;
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    const PartitionSpec& spec = specs[i];
    // eformer returns before reading the leaf when the spec is P(), so a P() leaf need not be
    // an array.
    if (spec.empty()) continue;
    const ArrayInfo& array = leaves[i].require_array();
    for (std::size_t d = 0; d < spec.size(); ++d) {
      if (spec[d].is_none()) continue;
      if (d >= array.shape.size()) throw IndexError("tuple index out of range");
      const std::int64_t size = entry_mesh_size(mesh_, spec[d]);
      if (size == 0 || array.shape[d] % size != 0) {
        issues.push_back(fmt::format("Array shape {} not divisible by mesh axis {} size {}",
                                     python_shape_repr(array.shape), spec[d].str(), size));
      }
    }
  }
  return issues;
}

MemoryEstimate ShardingAnalyzer::estimate_memory_usage(
    const std::vector<NamedLeaf>& leaves, const std::vector<PartitionSpec>& specs) const {
  require_same_length(leaves.size(), specs.size(), "estimate_memory_usage");
  if (mesh_.size() == 0) {
    throw ValueError(fmt::format("estimate_memory_usage: mesh {} has no devices", mesh_.repr()));
  }
  MemoryEstimate out;
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    std::int64_t size = leaves[i].require_array().nbytes();
    for (const AxisRule& entry : specs[i]) {
      if (entry.is_none()) continue;
      const std::int64_t n = entry_mesh_size(mesh_, entry);
      size = n == 0 ? 0 : size / n;
    }
    out.total_size += size;
  }
  out.size_per_device = out.total_size / mesh_.size();
  return out;
}

}  // namespace numesh::sharding
