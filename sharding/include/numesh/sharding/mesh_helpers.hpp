#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "numesh/sharding/axis_rule.hpp"
#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/partition_spec.hpp"

// Small mesh and spec helpers of eformer (`escale/partition/constraints.py`,
// `escale/partition/manager.py`; SPEC section 9).

namespace numesh::sharding {

/// eformer's get_incontext_mesh(raise_error): the current mesh of this thread (MeshScope).
/// Throws: NoMeshError ("No mesh found under this context manager.") when it is empty and
/// `raise_error`; with `raise_error` false the empty mesh is returned.
/// Thread-safety: safe to call concurrently; each thread sees its own current mesh.
[[nodiscard]] const Mesh& get_incontext_mesh(bool raise_error = true);

/// eformer's get_axes_size_in_mesh(name, mesh): the size of axis `name` of `*mesh`, or of the
/// current mesh when `mesh` is nullptr.
/// Throws: NoMeshError when `mesh` is nullptr and the current mesh is empty; KeyError (key =
/// the name) when the mesh has no such axis. Thread-safety: safe to call concurrently.
[[nodiscard]] std::int64_t get_axes_size_in_mesh(std::string_view name, const Mesh* mesh = nullptr);

/// get_axes_size_in_mesh for a string literal (the single-name form).
[[nodiscard]] inline std::int64_t get_axes_size_in_mesh(const char* name,
                                                        const Mesh* mesh = nullptr) {
  return get_axes_size_in_mesh(std::string_view(name), mesh);
}

/// get_axes_size_in_mesh for a sequence of names: the product of their sizes (1 for none).
/// Throws: as the single-name form. Thread-safety: safe to call concurrently.
[[nodiscard]] std::int64_t get_axes_size_in_mesh(const std::vector<std::string>& names,
                                                 const Mesh* mesh = nullptr);

/// get_axes_size_in_mesh for a dynamically typed value (from a config): a name, or a tuple or
/// list of names. Throws: TypeError "axis_names must be str or Sequence[str], got <class
/// 'int'>" for any other kind; KeyError (key = the member's repr when it is not a name) for an
/// unknown member; NoMeshError as above. Thread-safety: safe to call concurrently.
[[nodiscard]] std::int64_t get_axes_size_in_mesh(const AxisRule& axis_names,
                                                 const Mesh* mesh = nullptr);

/// eformer's get_mesh_axis_names(mesh): the axis names of `*mesh` (or of the current mesh).
/// Throws: NoMeshError when `mesh` is nullptr and the current mesh is empty.
[[nodiscard]] std::vector<std::string> get_mesh_axis_names(const Mesh* mesh = nullptr);

/// eformer's get_mesh_axis_size(axes), evaluated for one device of `mesh` rather than inside a
/// shard_map: the product of the sizes of `axis_names` (1 for none; order does not matter).
/// Throws: KeyError (key = the name, message "unbound axis name: x") for an axis `mesh` does
/// not have. Thread-safety: safe to call concurrently.
[[nodiscard]] std::int64_t get_mesh_axis_size(const Mesh& mesh,
                                              const std::vector<std::string>& axis_names);

/// eformer's get_submesh_device_index(axes), for the device at `device_coords` of `mesh` (one
/// coordinate per mesh axis): the row-major index of the device's coordinates over
/// `axis_names`, the last name varying fastest (0 for no names).
/// Example: mesh (dp=1, fsdp=4, ep=2, tp=2, sp=2), coords (0, 2, 0, 1, 1), axes (tp, fsdp)
/// -> 1 * 4 + 2 = 6.
/// Throws: ValueError when `device_coords` does not have one coordinate per mesh axis or a
/// coordinate is outside its axis; KeyError ("unbound axis name: x") for an unknown axis.
/// Thread-safety: safe to call concurrently.
[[nodiscard]] std::int64_t get_submesh_device_index(const Mesh& mesh,
                                                    const std::vector<std::int64_t>& device_coords,
                                                    const std::vector<std::string>& axis_names);

/// eformer's get_safe_hash_int(text, algorithm): the digest of the UTF-8 bytes of `text` read
/// as a big-endian unsigned integer, in decimal. `algorithm` is a hashlib constructor name:
/// md5 (default), sha1, sha224, sha256, sha384, sha512, sha3_224, sha3_256, sha3_384,
/// sha3_512, blake2b, blake2s (case-sensitive, as Python's getattr).
/// Example: get_safe_hash_int("hello world") == "125893641179230474042701625388361764291"
/// (eformer's docstring shows a wrong value).
/// Throws: ValueError "Unsupported hash algorithm: <algorithm>" for any other name (shake_128
/// and shake_256 included: they need a digest length eformer never passes).
/// Thread-safety: safe to call concurrently.
[[nodiscard]] std::string get_safe_hash_int(std::string_view text,
                                            std::string_view algorithm = "md5");

/// eformer's names_in_current_mesh(*names): true when every name is an axis of the current
/// mesh of this thread (true for no names; false for any name when there is no mesh).
/// Thread-safety: safe to call concurrently.
[[nodiscard]] bool names_in_current_mesh(const std::vector<std::string>& names);

/// eformer's get_names_from_partition_spec over a sequence of specs: every axis name used,
/// each once, sorted (eformer returns `list(set)`, whose order is unspecified).
/// Throws: TypeError "'int' object is not iterable" for an int entry (and the matching message
/// for UNCONSTRAINED or NOT_GIVEN), as eformer's recursion does.
/// Thread-safety: safe to call concurrently.
[[nodiscard]] std::vector<std::string> get_names_from_partition_spec(
    const std::vector<PartitionSpec>& specs);

/// get_names_from_partition_spec over a dict of specs (its values).
[[nodiscard]] std::vector<std::string> get_names_from_partition_spec(
    const std::map<std::string, PartitionSpec>& specs);

}  // namespace numesh::sharding
