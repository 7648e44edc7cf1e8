#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/named_array.hpp"
#include "numesh/sharding/partition_spec.hpp"

namespace numesh::sharding {

// eformer.escale.helpers: pluggable rules that map every leaf of a flattened tree to a spec
// (SPEC 11), and ShardingAnalyzer. Where eformer crashes (AutoShardingRule and
// estimate_memory_usage call np.prod on the mesh's shape dict; AutoShardingRule iterates a set;
// tuple entries raise KeyError), numesh does what the code evidently meant; the differences are
// listed in docs/eformer-compat.md.

/// A strategy mapping leaves to specs (eformer's abstract ShardingRule).
/// Thread-safety: apply() is const; the rules here are immutable after construction, so one
/// rule may be applied from several threads at once.
class ShardingRule {
 public:
  /// Rules are used through std::shared_ptr<const ShardingRule> (see CompositeShardingRule).
  virtual ~ShardingRule() = default;
  /// One spec per leaf, in the order of `leaves`.
  /// Throws: TypeError for a leaf without an array; rule-specific errors (see each class).
  [[nodiscard]] virtual std::vector<PartitionSpec> apply(
      const std::vector<NamedLeaf>& leaves) const = 0;
};

/// eformer's AutoShardingRule: the auto_partition_spec walk over a rule's own axes. Leaves
/// with fewer than `min_shard_size` elements get `P()`; otherwise dims are visited by size
/// descending (`reverse`: ascending; ties in index order) and each takes the first remaining
/// axis whose size divides it. Axes are tried in the order of `axis_names` (duplicates
/// dropped); eformer iterates a Python set, whose order depends on string hashing, so its
/// result is not reproducible.
///
///   AutoShardingRule rule(Mesh({"dp", "tp"}, {2, 4}), std::vector<std::string>{"tp"}, 1);
///   rule.apply(leaves)   // (4096, 4096) -> P('tp', None); (3, 5) -> P(None, None)
class AutoShardingRule final : public ShardingRule {
 public:
  /// `mesh` nullopt: current_mesh(). `axis_names` nullopt or empty: the mesh's axes in mesh
  /// order. `min_shard_size` nullopt or 0: the mesh's device count (eformer means this but
  /// computes `np.prod(mesh.shape)`, which raises TypeError).
  /// Throws: NoMeshError without a mesh. Unknown axis names throw KeyError from apply().
  explicit AutoShardingRule(const std::optional<Mesh>& mesh = std::nullopt,
                            std::optional<std::vector<std::string>> axis_names = std::nullopt,
                            std::optional<std::int64_t> min_shard_size = std::nullopt,
                            bool reverse = false);
  /// Throws: TypeError for a leaf without an array; KeyError (key = the name) for an axis
  /// name missing from the mesh (when a leaf is large enough to be sharded).
  [[nodiscard]] std::vector<PartitionSpec> apply(
      const std::vector<NamedLeaf>& leaves) const override;
  /// The spec for one shape. Throws: KeyError as apply().
  [[nodiscard]] PartitionSpec spec_for(const std::vector<std::int64_t>& shape) const;

 private:
  Mesh mesh_;
  std::vector<std::string> axis_names_;
  std::int64_t min_shard_size_;
  bool reverse_;
};

/// eformer's MemoryConstrainedShardingRule: shard a leaf only as far as needed to fit
/// `max_memory_per_device` bytes. A leaf of at most that many bytes gets `P()`. Otherwise the
/// axes are sorted by mesh size descending (stable), dims are visited by size descending
/// (ties in index order), each dim takes the first unused axis dividing it, and the running
/// size is floor-divided by that axis' size; the walk stops as soon as the running size fits.
///
///   // mesh dp=2, tp=4; (4096, 4096) float32 = 64 MiB, budget 32 MiB:
///   MemoryConstrainedShardingRule(32 << 20, mesh).apply(leaves)   // P('tp', None)
class MemoryConstrainedShardingRule final : public ShardingRule {
 public:
  /// `mesh` nullopt: current_mesh(). `axis_names` nullopt or empty: the mesh's axes.
  /// Throws: NoMeshError without a mesh.
  explicit MemoryConstrainedShardingRule(
      std::int64_t max_memory_per_device, const std::optional<Mesh>& mesh = std::nullopt,
      std::optional<std::vector<std::string>> axis_names = std::nullopt);
  /// Throws: TypeError for a leaf without an array; KeyError (key = the name) for an axis
  /// missing from the mesh (when a leaf is over budget); ValueError for an unknown dtype.
  [[nodiscard]] std::vector<PartitionSpec> apply(
      const std::vector<NamedLeaf>& leaves) const override;
  /// The spec for one array. Throws: as apply().
  [[nodiscard]] PartitionSpec spec_for(const ArrayInfo& array) const;

 private:
  std::int64_t max_memory_per_device_;
  Mesh mesh_;
  std::vector<std::string> axis_names_;
};

/// A shape pattern: one entry per dim, nullopt matching any extent.
using ShapePattern = std::vector<std::optional<std::int64_t>>;

/// eformer's ShapeBasedShardingRule: the spec of the first pattern (in the given order) with
/// the leaf's rank whose fixed extents all equal the leaf's; `P()` when none matches.
///
///   ShapeBasedShardingRule rule({{{4096, std::nullopt}, PartitionSpec{"tp", nullptr}},
///                                {{std::nullopt}, PartitionSpec{"dp"}}});
class ShapeBasedShardingRule final : public ShardingRule {
 public:
  /// Patterns in priority order. (eformer takes a dict; a repeated pattern keeps its first
  /// position there but its last spec. Here the first one wins.)
  explicit ShapeBasedShardingRule(std::vector<std::pair<ShapePattern, PartitionSpec>> patterns);
  /// Throws: TypeError for a leaf without an array.
  [[nodiscard]] std::vector<PartitionSpec> apply(
      const std::vector<NamedLeaf>& leaves) const override;

 private:
  std::vector<std::pair<ShapePattern, PartitionSpec>> patterns_;
};

/// eformer's CompositeShardingRule: every rule is applied, and each leaf takes the first spec
/// that is not `P()` (so `P(None, None)` counts as a choice, as in eformer), else `P()`.
class CompositeShardingRule final : public ShardingRule {
 public:
  /// Rules in priority order. REQUIRES: no rule is null.
  explicit CompositeShardingRule(std::vector<std::shared_ptr<const ShardingRule>> rules);
  /// Throws: whatever a rule throws.
  [[nodiscard]] std::vector<PartitionSpec> apply(
      const std::vector<NamedLeaf>& leaves) const override;

 private:
  std::vector<std::shared_ptr<const ShardingRule>> rules_;
};

/// eformer's ShardingAnalyzer.estimate_memory_usage result.
struct MemoryEstimate {
  /// Σ over leaves of the leaf's bytes floor-divided by the size of each non-None entry.
  std::int64_t total_size = 0;
  /// total_size floor-divided by the mesh's device count (eformer divides by
  /// `np.prod(mesh.shape)`, which raises TypeError).
  std::int64_t size_per_device = 0;

  friend bool operator==(const MemoryEstimate&, const MemoryEstimate&) = default;
};

/// eformer's ShardingAnalyzer: checks specs against shapes and estimates memory.
/// Thread-safety: immutable after construction; methods are const and safe to call
/// concurrently.
class ShardingAnalyzer {
 public:
  /// `mesh` nullopt: current_mesh(). Throws: NoMeshError without a mesh.
  explicit ShardingAnalyzer(const std::optional<Mesh>& mesh = std::nullopt);

  /// For each leaf whose spec is not `P()`, and each non-None entry at dim d: "Array shape
  /// {shape} not divisible by mesh axis {entry} size {size}" when shape[d] % size != 0. A
  /// tuple entry uses the product of its sizes and prints as `('dp', 'tp')`.
  /// Throws: ValueError when the lengths differ; IndexError ("tuple index out of range") for a
  /// non-None entry past the rank; KeyError for an axis missing from the mesh; TypeError for
  /// a leaf without an array whose spec is not `P()` (eformer returns before it reads a leaf
  /// whose spec is `P()`, so such a leaf may be a scalar).
  /// Example: mesh (dp=2, tp=4); shapes (4096, 4096) and (3, 5) with P('dp', 'tp') and P('dp')
  /// -> {"Array shape (3, 5) not divisible by mesh axis dp size 2"}.
  [[nodiscard]] std::vector<std::string> validate_partition_specs(
      const std::vector<NamedLeaf>& leaves, const std::vector<PartitionSpec>& specs) const;

  /// See MemoryEstimate. Throws: ValueError when the lengths differ or the mesh has no
  /// devices; KeyError for an axis missing from the mesh; TypeError for a leaf without an
  /// array.
  [[nodiscard]] MemoryEstimate estimate_memory_usage(const std::vector<NamedLeaf>& leaves,
                                                     const std::vector<PartitionSpec>& specs) const;

  /// The mesh the analyzer checks against.
  const Mesh& mesh() const noexcept { return mesh_; }

 private:
  Mesh mesh_;
};

}  // namespace numesh::sharding
