#include "numesh/sharding/corrected_sharding.hpp"

#include <fmt/format.h>

#include "numesh/core/error.hpp"
#include "numesh/sharding/mesh_context.hpp"

namespace numesh::sharding {

namespace {

// Checks one entry against the mesh and the extent of its dim (eformer's loop body).
// Returns the correction when the entry has to be dropped.
std::optional<Correction> check_entry(std::size_t dim, const AxisRule& entry, std::int64_t extent,
                                      const Mesh& mesh) {
  Correction c;
  c.dim = dim;
  c.original = entry;
  std::vector<AxisRule> names;
  if (entry.is_name()) {
    names.push_back(entry);
  } else if (entry.is_tuple()) {
    names = entry.members();
  } else {
    // UNCONSTRAINED, ints, and (not produced by P()) lists: eformer treats them as None.
    c.reason = CorrectionReason::kUnsupportedEntry;
    return c;
  }
  std::int64_t product = 1;
  for (const AxisRule& n : names) {
    // A None or int member is "not in mesh.axis_names" too.
    if (!n.is_name() || !mesh.has_axis(n.name())) {
      c.reason = CorrectionReason::kAxisNotInMesh;
      c.missing_axis = n.is_name() ? n.name() : n.repr();
      return c;
    }
    product *= mesh.axis_size(n.name());
  }
  // eformer: `if prod > 0 and dim % prod != 0: drop` / `elif prod == 0: drop`.
  if (product == 0 || extent % product != 0) {
    c.reason = CorrectionReason::kNotDivisible;
    c.dim_size = extent;
    c.mesh_size = product;
    return c;
  }
  return std::nullopt;
}

// eformer's with_sharding_constraint on one array, given the mesh it resolved.
std::optional<NamedSharding> constrain(const std::vector<std::int64_t>& shape,
                                       const PartitionSpec& spec, const Mesh& mesh) {
  if (mesh.empty() || spec.empty()) return std::nullopt;
  return NamedSharding(mesh, correct_spec(shape, spec, mesh).spec);
}

}  // namespace

std::string Correction::message() const {
  switch (reason) {
    case CorrectionReason::kUnsupportedEntry:
      return fmt::format("dim {}: {} dropped: not an axis name or a tuple of axis names", dim,
                         original.repr());
    case CorrectionReason::kAxisNotInMesh:
      return fmt::format("dim {}: {} dropped: axis {} is not in the mesh", dim, original.repr(),
                         missing_axis);
    case CorrectionReason::kNotDivisible:
      if (mesh_size == 0) {
        return fmt::format("dim {}: {} dropped: its mesh axes have total size 0", dim,
                           original.repr());
      }
      return fmt::format("dim {}: {} dropped: extent {} is not divisible by mesh size {}", dim,
                         original.repr(), dim_size, mesh_size);
    case CorrectionReason::kBeyondRank:
      return fmt::format("dim {}: {} dropped: the array has rank {}", dim, original.repr(), rank);
  }
  return {};
}

CorrectedSpec correct_spec(const std::vector<std::int64_t>& shape, const PartitionSpec& spec,
                           const Mesh& mesh) {
  CorrectedSpec out;
  if (spec.empty()) return out;
  const std::size_t rank = shape.size();
  std::vector<AxisRule> entries(rank);  // padded with None
  for (std::size_t i = 0; i < spec.size(); ++i) {
    const AxisRule& entry = spec[i];
    if (i >= rank) {
      if (!entry.is_none()) {
        Correction c;
        c.dim = i;
        c.original = entry;
        c.reason = CorrectionReason::kBeyondRank;
        c.rank = rank;
        out.corrections.push_back(std::move(c));
      }
      continue;
    }
    if (entry.is_none()) continue;
    if (auto c = check_entry(i, entry, shape[i], mesh)) {
      out.corrections.push_back(std::move(*c));
    } else {
      entries[i] = entry;
    }
  }
  bool any_sharded = false;
  for (const AxisRule& e : entries) any_sharded = any_sharded || !e.is_none();
  if (any_sharded) out.spec = PartitionSpec(std::move(entries));
  return out;
}

NamedSharding get_corrected_named_sharding(const std::vector<std::int64_t>& shape,
                                           const PartitionSpec& spec, bool raise_mesh_error,
                                           std::vector<std::string>* warnings) {
  return get_corrected_named_sharding(shape, spec, current_mesh(), raise_mesh_error, warnings);
}

NamedSharding get_corrected_named_sharding(const std::vector<std::int64_t>& shape,
                                           const PartitionSpec& spec, const Mesh& mesh,
                                           bool raise_mesh_error,
                                           std::vector<std::string>* warnings) {
  if (mesh.empty()) {
    if (raise_mesh_error) throw NoMeshError("No mesh found under this context manager.");
    if (warnings != nullptr) warnings->emplace_back(kEmptyMeshWarning);
    return NamedSharding(mesh, PartitionSpec());
  }
  return NamedSharding(mesh, correct_spec(shape, spec, mesh).spec);
}

std::optional<NamedSharding> with_sharding_constraint(const std::vector<std::int64_t>& shape,
                                                      const PartitionSpec& spec) {
  return constrain(shape, spec, current_mesh());
}

std::optional<NamedSharding> with_sharding_constraint(const std::vector<std::int64_t>& shape,
                                                      const NamedSharding& sharding) {
  return constrain(shape, sharding.spec(), sharding.mesh());
}

std::vector<std::optional<NamedSharding>> with_sharding_constraint_tree(
    const std::vector<NamedLeaf>& leaves, const PartitionSpec& spec) {
  std::vector<std::optional<NamedSharding>> out;
  out.reserve(leaves.size());
  for (const NamedLeaf& leaf : leaves) {
    out.push_back(leaf.array ? with_sharding_constraint(leaf.array->shape, spec) : std::nullopt);
  }
  return out;
}

std::vector<std::optional<NamedSharding>> with_sharding_constraint_tree(
    const std::vector<NamedLeaf>& leaves, const NamedSharding& sharding) {
  std::vector<std::optional<NamedSharding>> out;
  out.reserve(leaves.size());
  for (const NamedLeaf& leaf : leaves) {
    out.push_back(leaf.array ? with_sharding_constraint(leaf.array->shape, sharding)
                             : std::nullopt);
  }
  return out;
}

}  // namespace numesh::sharding
