#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/partition_spec.hpp"

// Per-device layout math: which slice of a global array each device of a mesh holds under a
// PartitionSpec, and which devices hold the same slice (XLA's HloSharding::TileOffsetForDevice
// / TileLimitForDevice, for JAX's NamedSharding semantics).

namespace numesh::sharding {

/// A half-open range [offset, offset + extent) of one array dimension.
struct DimSlice {
  std::int64_t offset = 0;
  std::int64_t extent = 0;
  /// One past the last index: offset + extent.
  std::int64_t limit() const noexcept { return offset + extent; }
  friend bool operator==(const DimSlice&, const DimSlice&) = default;
};

/// What one device holds.
struct DeviceShard {
  /// The device id (row-major position in the mesh).
  std::int64_t device = 0;
  /// The device's mesh coordinates, one per mesh axis.
  std::vector<std::int64_t> coords;
  /// Per array dim, which block of that dim the device holds (0-based; 0 for replicated dims).
  std::vector<std::int64_t> block;
  /// Per array dim, the slice of the global array the device holds.
  std::vector<DimSlice> slices;
  /// Index of the device's replica group in ShardLayout::replica_groups().
  std::size_t replica_group = 0;
  /// Position of the device inside its replica group (0 for the first, lowest-numbered copy).
  std::size_t replica_id = 0;
  friend bool operator==(const DeviceShard&, const DeviceShard&) = default;
};

/// The layout of an array of `shape` sharded by `spec` over `mesh`, as JAX lays out a
/// NamedSharding(mesh, spec):
///  - an entry `None` replicates its dim; a name `a` splits the dim into size(a) equal blocks,
///    and the device with coordinate c on `a` holds block c;
///  - a tuple `(a, b)` splits the dim into size(a) * size(b) blocks, major-to-minor in tuple
///    order: the device at (a = i, b = j) holds block i * size(b) + j;
///  - the spec is padded with None up to the rank;
///  - devices that differ only on mesh axes the spec does not use hold the same slice (a
///    replica group).
///
/// Worked example: mesh (dp=2, tp=4), shape (8, 16), P('dp', 'tp'): each device holds a
/// (4, 4) block; device 6 (coords {1, 2}) holds rows [4, 8) and columns [8, 12); there are 8
/// distinct shards and no replication. With P(None, 'tp') instead, each device holds (8, 4),
/// there are 4 distinct shards, and devices {0, 4}, {1, 5}, {2, 6}, {3, 7} are replica groups.
/// With P(('dp', 'tp')) on shape (16,) device d holds [2d, 2d + 2).
///
/// Uneven division is not modelled: every sharded dim must be divisible by its axes' product
/// (correct_spec() always produces such specs; XLA would pad instead).
///
/// A regular value type. Thread-safety: const methods are safe to call concurrently.
/// Complexity: construction is O(devices * (rank + mesh rank)).
class ShardLayout {
 public:
  /// Computes the layout.
  /// Checks, in order: extents are >= 0 (ShapeError); the mesh has devices (NoMeshError); the
  /// spec has at most rank entries (ShapeError); the spec names only mesh axes, each at most
  /// once, and holds no UNCONSTRAINED or integer entries (as NamedSharding: DuplicateSpecError
  /// or ValueError; ValueError for UNCONSTRAINED); every sharded dim is divisible by the
  /// product of its axes' sizes (ShapeError naming the dim, its size, the axes and the product).
  /// Throws: ShapeError, NoMeshError, DuplicateSpecError, ValueError as listed.
  ShardLayout(std::vector<std::int64_t> shape, PartitionSpec spec, Mesh mesh);

  /// The global shape.
  const std::vector<std::int64_t>& shape() const noexcept { return shape_; }
  /// The spec as given.
  const PartitionSpec& spec() const noexcept { return spec_; }
  /// The mesh.
  const Mesh& mesh() const noexcept { return mesh_; }
  /// Array rank.
  std::size_t rank() const noexcept { return shape_.size(); }

  /// Per array dim, the mesh axis indices it is split over, major to minor ({} = replicated).
  const std::vector<std::vector<std::size_t>>& dim_axes() const noexcept { return dim_axes_; }
  /// Per array dim, the number of blocks (product of its axes' sizes; 1 when replicated).
  const std::vector<std::int64_t>& blocks_per_dim() const noexcept { return blocks_per_dim_; }
  /// The shape every device holds: shape[d] / blocks_per_dim()[d].
  const std::vector<std::int64_t>& shard_shape() const noexcept { return shard_shape_; }

  /// Number of devices (the mesh size).
  std::int64_t num_devices() const noexcept { return mesh_.size(); }
  /// Number of distinct slices: the product of blocks_per_dim().
  std::int64_t num_shards() const noexcept;
  /// How many devices hold each slice: num_devices() / num_shards().
  std::int64_t replication() const noexcept { return num_devices() / num_shards(); }

  /// Every device, in device order.
  const std::vector<DeviceShard>& devices() const noexcept { return devices_; }
  /// What `device` holds. REQUIRES: 0 <= device < num_devices().
  const DeviceShard& device(std::int64_t device) const noexcept {
    return devices_[static_cast<std::size_t>(device)];
  }
  /// XLA's TileOffsetForDevice: the first index `device` holds on each dim.
  /// REQUIRES: 0 <= device < num_devices().
  std::vector<std::int64_t> tile_offset(std::int64_t device) const;
  /// XLA's TileLimitForDevice: one past the last index `device` holds on each dim.
  /// REQUIRES: 0 <= device < num_devices().
  std::vector<std::int64_t> tile_limit(std::int64_t device) const;

  /// Devices holding the same slice, one group per distinct slice, each sorted ascending;
  /// groups are ordered by their first device.
  const std::vector<std::vector<std::int64_t>>& replica_groups() const noexcept {
    return replica_groups_;
  }

  /// Elements each device holds (the product of shard_shape()).
  std::int64_t elements_per_device() const noexcept;
  /// Bytes each device holds for elements of `itemsize` bytes.
  /// Throws: ValueError when itemsize <= 0.
  std::int64_t bytes_per_device(std::int64_t itemsize) const;

  /// Stable compact text, e.g. "shape=[8,16] spec=P('dp', 'tp') mesh=[dp=2,tp=4]
  /// blocks=[2,4] shard=[4,4] shards=8 replication=1". Tests assert on it.
  std::string to_string() const;

  friend bool operator==(const ShardLayout&, const ShardLayout&) = default;

 private:
  std::vector<std::int64_t> shape_;
  PartitionSpec spec_;
  Mesh mesh_;
  std::vector<std::vector<std::size_t>> dim_axes_;
  std::vector<std::int64_t> blocks_per_dim_;
  std::vector<std::int64_t> shard_shape_;
  std::vector<DeviceShard> devices_;
  std::vector<std::vector<std::int64_t>> replica_groups_;
};

}  // namespace numesh::sharding
