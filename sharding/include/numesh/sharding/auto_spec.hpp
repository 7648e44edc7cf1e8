#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "numesh/sharding/axis_rule.hpp"
#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/named_array.hpp"
#include "numesh/sharding/partition_spec.hpp"

namespace numesh::sharding {

/// Which of eformer's two automatic-spec algorithms to run. They differ only in details (see
/// auto_partition_spec and vrn_auto_partition_spec).
enum class AutoSpecAlgorithm : std::uint8_t {
  kAuto,  ///< eformer's auto_partition_spec.
  kVrn,   ///< eformer's vrn_auto_partition_spec.
};

/// The knobs of auto_spec(); the defaults are eformer's.
struct AutoSpecOptions {
  /// Candidate entries, each a mesh axis name or a tuple of names (sharded over the product of
  /// their sizes). nullopt or empty: every mesh axis, ordered by size descending (ties keep
  /// mesh order).
  std::optional<std::vector<AxisRule>> names;
  /// Arrays with fewer elements stay replicated (`P()`). nullopt or 0: the mesh's device count.
  std::optional<std::int64_t> min_sharding_size;
  /// Visit tensor dims smallest first instead of largest first.
  bool reverse = false;
  /// Which eformer function to reproduce.
  AutoSpecAlgorithm algorithm = AutoSpecAlgorithm::kAuto;
};

/// A derived spec and the reasons for it, one human-readable sentence per decision, e.g.
///   "dim 0 (size 4096) takes 'fsdp' (size 8): 4096 % 8 == 0"
///   "dim 1 (size 3): no remaining candidate divides 3 (tried 'tp' (size 4))"
/// The wording is for people and may change; the spec is the contract.
struct AutoSpec {
  PartitionSpec spec;
  std::vector<std::string> reasoning;
};

/// Derives a partition spec for `array` from its shape alone (eformer's auto_partition_spec,
/// SPEC 8.1), and explains it.
///
/// Algorithm (kAuto): if `array.size() < min_sharding_size` the result is `P()`. Otherwise the
/// candidate names are de-duplicated (first occurrence kept); tensor dims are visited by size
/// descending (`reverse`: ascending), ties in index order (the stable order; see SPEC 8.1 on
/// numpy's argsort); each dim takes the first remaining candidate whose size divides its
/// extent, and that candidate is used up. The walk stops when no candidate is left. Size-1
/// axes divide everything, so they are assigned too: on mesh dp=1, fsdp=8 a (4096, 4096)
/// array gets `P('fsdp', 'dp')`.
/// kVrn differs exactly as eformer's vrn_auto_partition_spec does: names are not
/// de-duplicated (`{"dp", "dp"}` can give `P('dp', 'dp')`), an empty tuple candidate is
/// assigned (and canonicalised to None), and the walk never stops early.
///
/// `mesh`: nullopt means current_mesh().
/// Throws: NoMeshError ("No mesh found under this context manager.") when `mesh` is nullopt
/// and no mesh scope is active; KeyError (key = the name) when a candidate names an axis that
/// is not in the mesh (checked for every candidate, before any assignment, as eformer does);
/// TypeError when a candidate is neither a name nor a tuple/list of names (a nested tuple
/// included).
/// Thread-safety: safe to call concurrently (reads only this thread's mesh scope).
[[nodiscard]] AutoSpec auto_spec(const ArrayInfo& array,
                                 const std::optional<Mesh>& mesh = std::nullopt,
                                 const AutoSpecOptions& options = {});

/// eformer's `auto_partition_spec(x, mesh, names, min_sharding_size, reverse)`: auto_spec()
/// with AutoSpecAlgorithm::kAuto, returning only the spec.
///
///   Mesh mesh({"dp", "tp"}, {2, 4});
///   auto_partition_spec({{64, 64}}, mesh)          // P('tp', 'dp')
///   auto_partition_spec({{64, 64}}, mesh, {{"dp"}}) // P('dp', None)
///
/// Throws: as auto_spec(). Thread-safety: as auto_spec().
[[nodiscard]] PartitionSpec auto_partition_spec(
    const ArrayInfo& array, const std::optional<Mesh>& mesh = std::nullopt,
    const std::optional<std::vector<AxisRule>>& names = std::nullopt,
    std::optional<std::int64_t> min_sharding_size = std::nullopt, bool reverse = false);

/// eformer's `vrn_auto_partition_spec(x, mesh, names, min_sharding_size, reverse)`: auto_spec()
/// with AutoSpecAlgorithm::kVrn, returning only the spec. Unlike eformer, `names` may be any
/// sequence (eformer calls `names.copy()` and so rejects a tuple).
/// Throws: as auto_spec(). Thread-safety: as auto_spec().
[[nodiscard]] PartitionSpec vrn_auto_partition_spec(
    const ArrayInfo& array, const std::optional<Mesh>& mesh = std::nullopt,
    const std::optional<std::vector<AxisRule>>& names = std::nullopt,
    std::optional<std::int64_t> min_sharding_size = std::nullopt, bool reverse = false);

/// The product of the mesh sizes of a candidate entry: `mesh.axis_size(name)` for a name, the
/// product of its members' sizes for a tuple or list (1 for an empty one).
/// Throws: KeyError (key = the missing name); TypeError for any other kind of entry (None, an
/// int, ...). Thread-safety: pure.
[[nodiscard]] std::int64_t entry_mesh_size(const Mesh& mesh, const AxisRule& entry);

/// The mesh to use when a function takes an optional mesh: `mesh` when given, else
/// current_mesh(). Throws: NoMeshError ("No mesh found under this context manager.") when
/// neither is available (an empty current mesh). Thread-safety: reads this thread's scope.
[[nodiscard]] const Mesh& mesh_or_current(const std::optional<Mesh>& mesh);

}  // namespace numesh::sharding
