#pragma once

#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/partition_spec.hpp"

namespace numesh::sharding {

/// A partition spec bound to a mesh, validated as JAX's `NamedSharding(mesh, spec)` is.
///
/// Construction runs JAX's `check_pspec`, in this order:
///  1. no mesh axis appears twice, across entries or inside one tuple
///     (DuplicateSpecError: "A single NamedSharding spec specification can map every mesh axis
///     to at most one positional dimension, but P('dp', 'dp') has duplicate entries for `dp`");
///  2. every name in the spec is an axis of the mesh (ValueError: "Resource axis: model of
///     P('model',) is not found in mesh: ('dp', 'tp').").
/// The spec is not checked against a shape; see get_corrected_named_sharding for that.
/// A regular value type. Thread-safety: const methods are safe to call concurrently.
class NamedSharding {
 public:
  /// Binds `spec` to `mesh`. Throws: DuplicateSpecError, ValueError (see above).
  NamedSharding(Mesh mesh, PartitionSpec spec);

  const Mesh& mesh() const noexcept { return mesh_; }
  const PartitionSpec& spec() const noexcept { return spec_; }

  friend bool operator==(const NamedSharding&, const NamedSharding&) = default;

 private:
  Mesh mesh_;
  PartitionSpec spec_;
};

/// Runs the checks of NamedSharding's constructor without building one.
/// Throws: DuplicateSpecError, ValueError.
void check_partition_spec(const Mesh& mesh, const PartitionSpec& spec);

}  // namespace numesh::sharding
