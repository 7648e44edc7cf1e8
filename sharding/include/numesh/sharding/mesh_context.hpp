#pragma once

#include "numesh/sharding/mesh.hpp"

namespace numesh::sharding {

/// Makes `mesh` the current mesh of this thread for the scope's lifetime: eformer's (and
/// JAX's legacy) `with mesh:`. Scopes nest; destroying one restores the mesh that was current
/// before it. Functions that take an optional mesh (get_corrected_named_sharding,
/// auto_partition_spec, ...) fall back to current_mesh().
///
///   Mesh mesh({"dp", "tp"}, {2, 4});
///   MeshScope scope(mesh);
///   auto sharding = get_corrected_named_sharding({16, 30}, PartitionSpec{"dp", "tp"});
///
/// Thread-safety: the current mesh is per thread, as JAX's thread resources are; a scope must
/// be destroyed on the thread that created it, in reverse order of creation.
class MeshScope {
 public:
  /// Enters `mesh` (copied).
  explicit MeshScope(Mesh mesh);
  /// Restores the previous current mesh.
  ~MeshScope();
  MeshScope(const MeshScope&) = delete;
  MeshScope& operator=(const MeshScope&) = delete;

 private:
  Mesh mesh_;
  const Mesh* previous_;
};

/// The current mesh of this thread: the innermost MeshScope's, or the empty mesh.
const Mesh& current_mesh() noexcept;

}  // namespace numesh::sharding
