#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "numesh/sharding/axis_rule.hpp"
#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/named_array.hpp"
#include "numesh/sharding/named_sharding.hpp"
#include "numesh/sharding/partition_spec.hpp"

// Sharding correction: fitting a partition spec to an array shape and a mesh, as eformer's
// get_corrected_named_sharding and with_sharding_constraint do (eformer
// `escale/partition/constraints.py`; SPEC sections 6.1 and 6.2).

namespace numesh::sharding {

/// Why correct_spec dropped (replaced by None) one entry of a spec.
enum class CorrectionReason : std::uint8_t {
  /// The entry is neither a name nor a tuple (UNCONSTRAINED, an int): eformer treats it as None.
  kUnsupportedEntry,
  /// A name of the entry (or a member of its tuple, None included) is not a mesh axis.
  kAxisNotInMesh,
  /// The dim is not divisible by the product of the entry's axis sizes (or that product is 0).
  kNotDivisible,
  /// The entry lies past the array's rank; the spec was truncated to the rank.
  kBeyondRank,
};

/// One entry correct_spec dropped, with what a user needs to see why. Example (mesh fsdp=8,
/// shape (12, 32), spec P('fsdp')): {dim 0, 'fsdp', kNotDivisible, dim_size 12, mesh_size 8}.
struct Correction {
  /// Index of the entry in the spec (for kBeyondRank: >= the rank).
  std::size_t dim = 0;
  /// The entry as given (canonical).
  AxisRule original;
  CorrectionReason reason = CorrectionReason::kUnsupportedEntry;
  /// kAxisNotInMesh: the first member that is not a mesh axis (its repr when not a name,
  /// e.g. "None"). Empty otherwise.
  std::string missing_axis;
  /// kNotDivisible: the array's extent on `dim`.
  std::int64_t dim_size = 0;
  /// kNotDivisible: the product of the entry's mesh axis sizes.
  std::int64_t mesh_size = 0;
  /// kBeyondRank: the array's rank.
  std::size_t rank = 0;

  /// One sentence, e.g. "dim 0: 'fsdp' dropped: extent 12 is not divisible by mesh size 8".
  /// Thread-safety: safe to call concurrently.
  [[nodiscard]] std::string message() const;

  friend bool operator==(const Correction&, const Correction&) = default;
};

/// The result of correct_spec: the spec to use and every entry that was dropped, in dim order.
struct CorrectedSpec {
  PartitionSpec spec;
  std::vector<Correction> corrections;
};

/// Fits `spec` to an array of `shape` on `mesh`, exactly as eformer's correction does (pure:
/// it does not look at the current mesh, and it does not check for duplicate axes):
///  - P() stays P();
///  - the spec is padded with None up to the rank, or truncated to it;
///  - an entry is dropped to None when it is not a name or tuple, when any of its names is not
///    a mesh axis, or when the dim is not divisible by the product of its axis sizes (axes of
///    size 1 and dims of extent 0 are always kept);
///  - if every entry ends up None, the result is P().
/// Example: mesh (dp=2, tp=4), shape (3, 8), P('dp', 'tp') -> P(None, 'tp'), one correction.
/// REQUIRES: extents in `shape` are >= 0. Throws: nothing beyond std::bad_alloc.
/// Thread-safety: safe to call concurrently.
[[nodiscard]] CorrectedSpec correct_spec(const std::vector<std::int64_t>& shape,
                                         const PartitionSpec& spec, const Mesh& mesh);

/// The warning eformer issues when the mesh is empty and raise_mesh_error is false.
inline constexpr const char* kEmptyMeshWarning =
    "Active mesh is empty. Returning replicated NamedSharding.";

/// eformer's get_corrected_named_sharding(shape, spec, raise_mesh_error) on the current mesh
/// of this thread (MeshScope): NamedSharding(mesh, correct_spec(shape, spec, mesh).spec).
/// When the current mesh is empty: throws NoMeshError ("No mesh found under this context
/// manager.") if `raise_mesh_error`, else appends kEmptyMeshWarning to `*warnings` (when
/// non-null) and returns NamedSharding(empty mesh, P()).
/// Throws: NoMeshError (above); DuplicateSpecError when the corrected spec uses a mesh axis
/// twice (correction never removes duplicates). Thread-safety: safe to call concurrently; each
/// thread sees its own current mesh.
[[nodiscard]] NamedSharding get_corrected_named_sharding(
    const std::vector<std::int64_t>& shape, const PartitionSpec& spec, bool raise_mesh_error = true,
    std::vector<std::string>* warnings = nullptr);

/// As above, on an explicit `mesh` instead of the current one (an empty `mesh` behaves as an
/// empty current mesh does).
[[nodiscard]] NamedSharding get_corrected_named_sharding(
    const std::vector<std::int64_t>& shape, const PartitionSpec& spec, const Mesh& mesh,
    bool raise_mesh_error = true, std::vector<std::string>* warnings = nullptr);

/// eformer's with_sharding_constraint(array, spec) for an array of `shape`, P form: on the
/// current mesh of this thread. Returns the sharding the constraint applies, or nullopt when
/// eformer applies none: the current mesh is empty (no error), or `spec` is P(). Otherwise the
/// spec is corrected (correct_spec) and applied; an all-None result is applied as P().
/// Example: mesh fsdp=8, shape (12, 32), P('fsdp') -> NamedSharding(mesh, P()) (applied).
/// Throws: DuplicateSpecError when the corrected spec uses an axis twice.
/// Thread-safety: safe to call concurrently.
[[nodiscard]] std::optional<NamedSharding> with_sharding_constraint(
    const std::vector<std::int64_t>& shape, const PartitionSpec& spec);

/// with_sharding_constraint, NamedSharding form: as the P form, on `sharding.mesh()` (the
/// current mesh is ignored). Throws: DuplicateSpecError. Thread-safety: safe to call
/// concurrently.
[[nodiscard]] std::optional<NamedSharding> with_sharding_constraint(
    const std::vector<std::int64_t>& shape, const NamedSharding& sharding);

/// with_sharding_constraint over a flattened pytree (P form; a separate name so that a
/// braced shape such as `{8}` is never ambiguous): one result per leaf, nullopt for
/// a leaf without an array (eformer returns such leaves untouched) and wherever the single-leaf
/// form gives nullopt. Throws: DuplicateSpecError, for the first array leaf whose corrected
/// spec repeats an axis. Thread-safety: safe to call concurrently.
[[nodiscard]] std::vector<std::optional<NamedSharding>> with_sharding_constraint_tree(
    const std::vector<NamedLeaf>& leaves, const PartitionSpec& spec);

/// with_sharding_constraint over a flattened pytree, NamedSharding form.
[[nodiscard]] std::vector<std::optional<NamedSharding>> with_sharding_constraint_tree(
    const std::vector<NamedLeaf>& leaves, const NamedSharding& sharding);

}  // namespace numesh::sharding
