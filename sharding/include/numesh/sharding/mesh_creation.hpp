#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/partition_spec.hpp"

// Mesh creation: eformer's create_mesh shape logic on a logical device count, its helpers, and
// MeshPartitionHelper (eformer `escale/mesh/creation.py`, `escale/mesh/mesh_helpers.py`;
// SPEC section 10). numesh lays devices out itself (the runtime binds mesh slots to NUMA
// devices), so these functions compute shapes, not JAX device arrays.

namespace numesh::sharding {

/// eformer's default mesh dims, (1, -1, 1, 1, 1).
inline const std::vector<std::int64_t> kDefaultMeshDims{1, -1, 1, 1, 1};
/// eformer's default mesh axis names, ("dp", "fsdp", "ep", "tp", "sp").
inline const std::vector<std::string> kDefaultMeshNames{"dp", "fsdp", "ep", "tp", "sp"};

/// JAX's mesh AxisType.
enum class AxisType : std::uint8_t { kAuto, kExplicit, kManual };

/// "Auto", "Explicit" or "Manual" (JAX's member names).
[[nodiscard]] std::string_view to_string(AxisType type) noexcept;

/// eformer's _normalize_axis_types for typed input: one type per axis name; a single type is
/// broadcast to every axis. Throws: ValueError "axis_types length must match axis_names length.
/// Got N types for M axis names." when `types` has neither 1 nor names.size() entries.
/// Thread-safety: safe to call concurrently.
[[nodiscard]] std::vector<AxisType> normalize_axis_types(const std::vector<std::string>& axis_names,
                                                         const std::vector<AxisType>& types);

/// eformer's _normalize_axis_types for dynamically typed input (a config value): null gives
/// nullopt; a string is broadcast; an array is one entry per axis (a 1-entry array is
/// broadcast). Strings are matched after trimming whitespace and lower-casing against
/// auto|explicit|manual.
/// Throws: ValueError "axis_types must be one of {'auto', 'explicit', 'manual'} or AxisType, got
/// 'bogus'." for another string; TypeError "axis_types entries must be strings or AxisType
/// values, got <class 'int'>." for a non-string entry (and "'int' object is not iterable" for
/// a non-string, non-array value); ValueError for a length mismatch (as above).
/// Thread-safety: safe to call concurrently.
[[nodiscard]] std::optional<std::vector<AxisType>> normalize_axis_types(
    const std::vector<std::string>& axis_names, const nlohmann::json& axis_types);

/// eformer's calculate_host_mesh_shape(global_mesh_shape, total_devices, num_processes): the
/// part of the global mesh one host holds. The process count is split over the axes left to
/// right: an axis at least as large as the remaining count is divided by it and the walk
/// stops; a smaller axis becomes 1 and divides the remaining count.
/// Example: ((2, 2, 1, 2, 1), 2 devices, 4 processes) -> (1, 1, 1, 2, 1).
/// Throws: ValueError "Mesh size 8 doesn't match available devices 16 (local x processes)"
/// when prod(global) != total_devices * num_processes; ValueError "Host mesh shape (1, 3) uses
/// 3 devices instead of 2. Ensure that num_processes factors the global mesh shape." when the
/// split does not come out to `total_devices`; ValueError "integer division or modulo by zero"
/// when the walk reaches a 0-size axis. Thread-safety: safe to call concurrently.
[[nodiscard]] std::vector<std::int64_t> calculate_host_mesh_shape(
    const std::vector<std::int64_t>& global_mesh_shape, std::int64_t total_devices,
    std::int64_t num_processes);

/// eformer's fill_minus_one_to_target(dcn_shape, target): replaces one -1 so that the product
/// is `target`. Example: ((2, -1), 8) -> (2, 4).
/// Throws: ValueError "Only one -1 is supported in dcn_mesh_dims." (two -1s); "dcn_mesh_dims
/// entries must be > 0 or -1, got 0"; "dcn_mesh_dims product (3) does not divide target (4).";
/// "dcn_mesh_dims product 2 must equal 4; got (2,)" (no -1 and the product differs).
/// Thread-safety: safe to call concurrently.
[[nodiscard]] std::vector<std::int64_t> fill_minus_one_to_target(
    const std::vector<std::int64_t>& shape, std::int64_t target);

/// What create_mesh needs to know of the machine and of the optional arguments.
struct CreateMeshOptions {
  /// Devices in the whole job (all processes).
  std::int64_t device_count = 1;
  /// Processes in the job; devices are split evenly (device_count / process_count each).
  std::int64_t process_count = 1;
  /// Slices of a multi-slice job (eformer reads it from the devices or MEGASCALE_NUM_SLICES).
  std::int64_t num_slices = 1;
  /// eformer's dcn_mesh_dims: the inter-host (or inter-slice) factor of each axis; one -1
  /// allowed. nullopt: derived as eformer does.
  std::optional<std::vector<std::int64_t>> dcn_mesh_dims;
};

/// The layout create_mesh decides: the mesh, and how its axes split into a per-host (or
/// per-slice) part and a cross-host (DCN) factor. mesh sizes == local_shape * dcn_shape.
struct MeshLayout {
  Mesh mesh;
  /// Per-host (multi-process) or per-slice (multi-slice) shape; the mesh shape otherwise.
  std::vector<std::int64_t> local_shape;
  /// Cross-host / cross-slice factor of each axis; all 1 in a single process.
  std::vector<std::int64_t> dcn_shape;
};

/// eformer's create_mesh(axis_dims, axis_names, dcn_mesh_dims) shape logic, on a logical
/// device count. The global shape is resolve_mesh_dims(axis_dims, device_count); then
///  - multi-slice (num_slices > 1): the first axis divisible by num_slices is split into a
///    per-slice part and a DCN factor (or dcn_mesh_dims is filled to num_slices);
///  - multi-process: calculate_host_mesh_shape gives the per-host part; the DCN factor is
///    global / local per axis, or the process count on axis 0 when those ratios do not
///    multiply to it (or dcn_mesh_dims filled to the process count);
///  - single process: the global shape.
/// Example: with options.device_count = 8 and options.process_count = 2,
/// create_mesh_layout({2, -1, 1, 1, 1}, kDefaultMeshNames, options) has mesh sizes
/// (2, 4, 1, 1, 1), local_shape (1, 4, 1, 1, 1) and dcn_shape (2, 1, 1, 1, 1).
/// Throws: ValueError from resolve_mesh_dims, calculate_host_mesh_shape and
/// fill_minus_one_to_target; ValueError "Multi-slice detected (num_slices=N) but no mesh axis
/// in (..) is divisible by num_slices."; ValueError when device_count is not divisible by
/// process_count or the names do not fit the dims (Mesh's constructor).
/// Thread-safety: safe to call concurrently.
[[nodiscard]] MeshLayout create_mesh_layout(
    const std::vector<std::int64_t>& axis_dims = kDefaultMeshDims,
    const std::vector<std::string>& axis_names = kDefaultMeshNames,
    const CreateMeshOptions& options = {});

/// create_mesh_layout(...).mesh.
[[nodiscard]] Mesh create_mesh(const std::vector<std::int64_t>& axis_dims = kDefaultMeshDims,
                               const std::vector<std::string>& axis_names = kDefaultMeshNames,
                               const CreateMeshOptions& options = {});

/// The result of parse_mesh_from_string: dims and names, in the order of the string.
struct ParsedMeshSpec {
  std::vector<std::int64_t> axis_dims;
  std::vector<std::string> axis_names;
  friend bool operator==(const ParsedMeshSpec&, const ParsedMeshSpec&) = default;
};

/// eformer's parse_mesh_from_string(axis_dims, names), without creating the mesh (pass the
/// result to create_mesh). Two forms:
///  - named, "dp:2,tp:4": each name must be one of `names`, and every name must be used;
///  - positional, "2,4": zipped with `names`.
/// Dims are parsed as Python's int() does (whitespace, sign, underscores).
/// Throws: ValueError "Axis name 'xx' not found in provided names: ['dp', 'tp']"; "Not all
/// axis names were used in 'axis_dims'"; "Number of dimensions and names must match";
/// "invalid literal for int() with base 10: 'x'"; "not enough values to unpack (expected 2,
/// got 1)" / "too many values to unpack (expected 2)" for a named piece without exactly one ':'.
/// Thread-safety: safe to call concurrently.
[[nodiscard]] ParsedMeshSpec parse_mesh_from_string(std::string_view axis_dims,
                                                    const std::vector<std::string>& names);

/// eformer's MeshPartitionHelper: suggests sharding methods for a shape from the mesh's axes
/// (only the axis names dp, fsdp, tp and sp are considered) and turns them into a spec.
/// Results are eformer's, quirks included: the fallback assigns ('fsdp', 'sp') to dims 0 and
/// 1 without checking divisibility, so (1, 8) on any mesh can give P('fsdp', 'sp').
/// A regular value type. Thread-safety: const methods are safe to call concurrently.
class MeshPartitionHelper {
 public:
  /// One suggested method: the mesh axes to shard over together, e.g. {"fsdp", "sp"}.
  using Method = std::vector<std::string>;

  explicit MeshPartitionHelper(Mesh mesh) : mesh_(std::move(mesh)) {}

  const Mesh& mesh() const noexcept { return mesh_; }

  /// eformer's _suggest_methods(shape), in priority order:
  ///  ('fsdp','sp') if rank > 1 and shape[0]*shape[1] >= size(fsdp)*size(sp); ('dp',) if
  ///  rank > 0; ('sp',) if rank > 1 and ('fsdp','sp') was not added; ('tp',); ('fsdp',) if no
  ///  method so far mentions fsdp. Each only when its axes exist in the mesh.
  /// Thread-safety: safe to call concurrently.
  [[nodiscard]] std::vector<Method> suggest_methods(const std::vector<std::int64_t>& shape) const;

  /// eformer's create_partition_spec(shape, methods, min_shard_size): P() for a scalar;
  /// otherwise single-axis methods take the first free dim of at least max(min_shard_size,
  /// size / (2 * devices)) elements divisible by the axis; a 2-axis method takes dims 0 and 1
  /// (or dim 0 alone); if nothing was assigned, a fallback pass uses min_shard_size alone and
  /// assigns ('fsdp', 'sp') unchecked. Methods of 0 or 3+ axes are ignored.
  /// Throws: KeyError (key = the axis) for a method axis the mesh does not have (where eformer
  /// looks it up); ValueError "integer division or modulo by zero" for a size-0 axis where
  /// Python divides by it; IndexError "list index out of range" when a caller-given
  /// ('fsdp', 'sp') method reaches the fallback for a 1-d shape. Thread-safety: safe to call
  /// concurrently.
  [[nodiscard]] PartitionSpec create_partition_spec(const std::vector<std::int64_t>& shape,
                                                    const std::vector<Method>& methods,
                                                    std::int64_t min_shard_size = 1024) const;

  /// create_partition_spec(shape, suggest_methods(shape), min_shard_size): what eformer's
  /// auto_shard_pytree places each array with.
  [[nodiscard]] PartitionSpec auto_partition_spec(const std::vector<std::int64_t>& shape,
                                                  std::int64_t min_shard_size = 1024) const;

 private:
  Mesh mesh_;
};

}  // namespace numesh::sharding
