#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "numesh/sharding/axis_rule.hpp"
#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/named_array.hpp"
#include "numesh/sharding/partition_spec.hpp"

namespace numesh::sharding {

// Whole-model sharding strategies: eformer's optimize_sharding_for_memory,
// convert_sharding_strategy, validate_sharding_config and analyze_sharding_strategy (SPEC
// 8.2-8.5). Trees are flattened: `leaves` are in JAX order, and a list of specs passed with
// them holds one spec per leaf, in the same order (eformer's tree_map over two trees).

/// eformer's `optimize_sharding_for_memory`: one spec per leaf. A leaf of fewer than
/// `max_memory_per_device` bytes, or any leaf when the limit is nullopt, gets `P()`;
/// a larger one gets `auto_partition_spec(leaf, mesh, names)` with the default minimum size.
/// `names` nullopt means the mesh axes in mesh order (not size-sorted; an empty list falls
/// through to auto_partition_spec's size-sorted default).
///
///   // mesh dp=2, tp=4; a 64 MiB float32 (4096, 4096) kernel over a 1 MiB budget:
///   optimize_sharding_for_memory(leaves, mesh, 1 << 20)   // {P('dp', 'tp'), ...}
///
/// `mesh`: nullopt means current_mesh().
/// Throws: NoMeshError without a mesh; TypeError for a leaf without an array; KeyError for a
/// name not in the mesh (from auto_partition_spec); ValueError for an unknown dtype.
/// Thread-safety: safe to call concurrently.
[[nodiscard]] std::vector<PartitionSpec> optimize_sharding_for_memory(
    const std::vector<NamedLeaf>& leaves, const std::optional<Mesh>& mesh = std::nullopt,
    std::optional<std::int64_t> max_memory_per_device = std::nullopt,
    const std::optional<std::vector<AxisRule>>& names = std::nullopt);

/// Named specs in insertion order (eformer's `dict[str, PartitionSpec]`).
using NamedSpecs = std::vector<std::pair<std::string, PartitionSpec>>;

/// eformer's `convert_sharding_strategy`. For strategy "preserve_balance", each entry's
/// parallel factor (the product of the old mesh sizes of its non-None entries; a tuple
/// entry counts the product of its members) becomes the minimum size of
/// `auto_partition_spec(array, new_mesh)`; the same `array` is used for every key, as in
/// eformer. Any other strategy yields no entries (eformer silently returns `{}`).
///
/// Throws: KeyError (key = the name) when a spec names an axis missing from `old_mesh`.
/// Thread-safety: pure.
[[nodiscard]] NamedSpecs convert_sharding_strategy(const ArrayInfo& array,
                                                   const NamedSpecs& old_specs,
                                                   const Mesh& old_mesh, const Mesh& new_mesh,
                                                   std::string_view strategy = "preserve_balance");

/// eformer's `validate_sharding_config`: the issues found, in leaf order. Per leaf:
///  1. for each non-None entry at dim d: "Array at {path} with shape {shape} not divisible by
///     mesh axis {entry} size {size}" when shape[d] % size != 0 (a tuple entry is checked
///     against the product of its sizes and printed as `('dp', 'tp')`);
///  2. "Small array at {path} might not benefit from sharding" when the leaf has fewer than
///     1024 elements and its spec is not `P()` (`P(None)` counts, as in eformer).
/// `{path}` is JAX's key-path repr built by jax_keypath_repr(leaf.path); `{shape}` is the
/// Python tuple repr, e.g. `(30, 7)`.
///
/// `mesh`: nullopt means current_mesh().
/// Throws: ValueError when `specs` and `leaves` differ in length; IndexError ("tuple index
/// out of range", eformer's text) when a non-None entry lies past the leaf's rank; KeyError
/// (key = the name) for an axis missing from the mesh; TypeError for a leaf without an array;
/// NoMeshError without a mesh. Thread-safety: safe to call concurrently.
[[nodiscard]] std::vector<std::string> validate_sharding_config(
    const std::vector<NamedLeaf>& leaves, const std::vector<PartitionSpec>& specs,
    const std::optional<Mesh>& mesh = std::nullopt);

/// How a strategy uses the mesh (filled in by numesh; eformer returns `{}`).
struct PartitionStats {
  /// Number of leaves.
  std::int64_t leaves = 0;
  /// Leaves with at least one non-None entry (actually split over some mesh axis).
  std::int64_t sharded_leaves = 0;
  /// Leaves whose spec is `P()` or all None.
  std::int64_t replicated_leaves = 0;
  /// For each mesh axis (in mesh order; axes no spec uses included with 0): the number of
  /// leaves whose spec uses it.
  std::vector<std::pair<std::string, std::int64_t>> axis_usage;

  friend bool operator==(const PartitionStats&, const PartitionStats&) = default;
};

/// The result of analyze_sharding_strategy.
struct ShardingAnalysis {
  /// Σ elements over all leaves.
  std::int64_t total_parameters = 0;
  /// Σ elements over leaves whose spec is not `P()` (eformer's test: `P(None)` counts).
  std::int64_t sharded_parameters = 0;
  /// Bytes of array data each device holds, indexed by device id (Mesh numbering). A dim of
  /// extent D split n ways is laid out as XLA does: ceil(D/n) per shard, the last shards
  /// shorter or empty; padding is not counted. Replicated dims count in full.
  std::vector<std::int64_t> memory_per_device;
  /// min / max of memory_per_device: 1.0 when every device holds the same bytes, lower when
  /// uneven splits load some devices more; 1.0 when no device holds anything.
  double balance_score = 1.0;
  /// Counts of sharded and replicated leaves and per-axis usage.
  PartitionStats partition_stats;
};

/// eformer's `analyze_sharding_strategy`, with the fields eformer leaves as placeholders
/// (memory_per_device `{}`, balance_score 0.0, partition_stats `{}`) computed; see
/// ShardingAnalysis. Example: mesh dp=2, tp=4, one float32 (30, 7) leaf with P('tp'): 30 rows
/// split 4 ways are 8, 8, 8, 6, so devices with tp coordinate 0-2 hold 8*7*4 = 224 bytes and
/// tp = 3 holds 168; balance_score = 168/224 = 0.75.
///
/// `mesh`: nullopt means current_mesh().
/// Throws: ValueError when `specs` and `leaves` differ in length, or when a spec shards a dim
/// past the leaf's rank; KeyError (key = the name) for an axis missing from the mesh;
/// TypeError for a leaf without an array; NoMeshError without a mesh.
/// Thread-safety: safe to call concurrently.
[[nodiscard]] ShardingAnalysis analyze_sharding_strategy(
    const std::vector<NamedLeaf>& leaves, const std::vector<PartitionSpec>& specs,
    const std::optional<Mesh>& mesh = std::nullopt);

/// JAX's repr of a key path, from a '/'-joined leaf path: `"params/w"` gives
/// `(DictKey(key='params'), DictKey(key='w'))`, `"x"` gives `(DictKey(key='x'),)`, `""` gives
/// `()`. A component made only of digits is taken for a list index (`SequenceKey(idx=0)`): the
/// joined path cannot tell a list index from a dict key "0". Thread-safety: pure.
[[nodiscard]] std::string jax_keypath_repr(std::string_view path);

/// Python's repr of a shape tuple: `()`, `(10,)`, `(30, 7)`. Thread-safety: pure.
[[nodiscard]] std::string python_shape_repr(const std::vector<std::int64_t>& shape);

}  // namespace numesh::sharding
