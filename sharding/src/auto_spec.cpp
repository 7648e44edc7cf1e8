#include "numesh/sharding/auto_spec.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <utility>

#include "numesh/core/error.hpp"
#include "numesh/sharding/mesh_context.hpp"

namespace numesh::sharding {

namespace {

// `'fsdp' (size 8)` / `('fsdp', 'sp') (size 8)`.
std::string describe(const AxisRule& entry, std::int64_t size) {
  return fmt::format("{} (size {})", entry.repr(), size);
}

// Indices 0..n-1 ordered by `key` ascending; ties keep index order. eformer uses np.argsort
// (not guaranteed stable); SPEC 8.1 explains why the stable order is the one to reproduce.
template <typename Key>
std::vector<std::size_t> stable_argsort(std::size_t n, Key key) {
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return key(a) < key(b); });
  return order;
}

}  // namespace

const Mesh& mesh_or_current(const std::optional<Mesh>& mesh) {
  if (mesh) return *mesh;
  const Mesh& current = current_mesh();
  if (current.empty()) throw NoMeshError("No mesh found under this context manager.");
  return current;
}

std::int64_t entry_mesh_size(const Mesh& mesh, const AxisRule& entry) {
  if (entry.is_name()) return mesh.axis_size(entry.name());
  if (entry.is_sequence()) {
    std::int64_t product = 1;
    for (const AxisRule& member : entry.members()) {
      if (!member.is_name()) {
        throw TypeError(fmt::format("a tuple of mesh axis names may only hold names; {} holds {}",
                                    entry.repr(), member.repr()));
      }
      product *= mesh.axis_size(member.name());
    }
    return product;
  }
  throw TypeError(
      fmt::format("expected a mesh axis name or a tuple of mesh axis names, got {}", entry.repr()));
}

AutoSpec auto_spec(const ArrayInfo& array, const std::optional<Mesh>& mesh_arg,
                   const AutoSpecOptions& options) {
  const Mesh& mesh = mesh_or_current(mesh_arg);
  const bool vrn = options.algorithm == AutoSpecAlgorithm::kVrn;
  AutoSpec out;
  auto note = [&](std::string line) { out.reasoning.push_back(std::move(line)); };

  // `min_sharding_size or device_count`: 0 counts as "not given", as in eformer.
  const std::int64_t min_size =
      options.min_sharding_size.value_or(0) != 0 ? *options.min_sharding_size : mesh.size();
  if (array.size() < min_size) {
    note(fmt::format("array has {} elements, fewer than min_sharding_size {}: replicated (P())",
                     array.size(), min_size));
    return out;
  }

  // Candidates: the given names, or the mesh axes by size descending (ties in mesh order).
  std::vector<AxisRule> names;
  if (options.names && !options.names->empty()) {
    names = *options.names;
  } else {
    const auto& sizes = mesh.sizes();
    for (std::size_t i : stable_argsort(sizes.size(), [&](std::size_t i) { return -sizes[i]; })) {
      names.emplace_back(mesh.names()[i]);
    }
  }
  // Every candidate's size is computed up front, so a bad name fails before any assignment.
  std::vector<std::int64_t> sizes;
  sizes.reserve(names.size());
  for (const AxisRule& n : names) sizes.push_back(entry_mesh_size(mesh, n));

  // kAuto de-duplicates (dict.fromkeys keeps first occurrences); kVrn keeps duplicates.
  std::vector<std::size_t> remaining;  // indices into names/sizes
  for (std::size_t i = 0; i < names.size(); ++i) {
    const bool duplicate = std::any_of(remaining.begin(), remaining.end(),
                                       [&](std::size_t j) { return names[j] == names[i]; });
    if (vrn || !duplicate) remaining.push_back(i);
  }
  {
    std::vector<std::string> listed;
    for (std::size_t i : remaining) listed.push_back(describe(names[i], sizes[i]));
    note(fmt::format("candidates in order: {}", fmt::join(listed, ", ")));
  }

  const auto& shape = array.shape;
  const auto dims = stable_argsort(
      shape.size(), [&](std::size_t d) { return options.reverse ? shape[d] : -shape[d]; });

  std::vector<AxisRule> entries(shape.size());
  for (std::size_t d : dims) {
    const std::int64_t extent = shape[d];
    auto found = std::find_if(remaining.begin(), remaining.end(), [&](std::size_t i) {
      return sizes[i] != 0 && extent % sizes[i] == 0;
    });
    if (found == remaining.end()) {
      std::vector<std::string> tried;
      for (std::size_t i : remaining) tried.push_back(describe(names[i], sizes[i]));
      note(fmt::format("dim {} (size {}): no remaining candidate divides {} (tried {})", d, extent,
                       extent, tried.empty() ? "none" : fmt::format("{}", fmt::join(tried, ", "))));
    } else if (!vrn && !names[*found].truthy()) {
      // eformer's `if best_name:`: an empty tuple matches but is never assigned or used up.
      note(fmt::format("dim {} (size {}): first divisor {} is empty, so the dim stays replicated",
                       d, extent, names[*found].repr()));
    } else {
      const std::size_t i = *found;
      entries[d] = names[i];
      note(fmt::format("dim {} (size {}) takes {}: {} % {} == 0", d, extent,
                       describe(names[i], sizes[i]), extent, sizes[i]));
      remaining.erase(found);
    }
    if (!vrn && remaining.empty()) {
      note("every candidate is used; the remaining dims stay replicated");
      break;
    }
  }
  out.spec = PartitionSpec(std::move(entries));
  note(fmt::format("result: {}", out.spec.repr()));
  return out;
}

PartitionSpec auto_partition_spec(const ArrayInfo& array, const std::optional<Mesh>& mesh,
                                  const std::optional<std::vector<AxisRule>>& names,
                                  std::optional<std::int64_t> min_sharding_size, bool reverse) {
  return auto_spec(array, mesh,
                   AutoSpecOptions{names, min_sharding_size, reverse, AutoSpecAlgorithm::kAuto})
      .spec;
}

PartitionSpec vrn_auto_partition_spec(const ArrayInfo& array, const std::optional<Mesh>& mesh,
                                      const std::optional<std::vector<AxisRule>>& names,
                                      std::optional<std::int64_t> min_sharding_size, bool reverse) {
  return auto_spec(array, mesh,
                   AutoSpecOptions{names, min_sharding_size, reverse, AutoSpecAlgorithm::kVrn})
      .spec;
}

}  // namespace numesh::sharding
