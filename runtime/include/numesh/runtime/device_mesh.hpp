#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "numesh/runtime/device.hpp"
#include "numesh/sharding/mesh.hpp"

namespace numesh::runtime {

/// A named N-d mesh over the devices of a DeviceSet: the physical counterpart of
/// sharding::Mesh. Mesh slot i (row-major over the axes, as `np.arange(n).reshape(dims)`)
/// is device i of the set, which is what eformer's create_mesh does with CPU devices.
///
/// A cheap copyable handle (the devices are shared). Thread-safety: const methods are safe to
/// call concurrently.
class DeviceMesh {
 public:
  /// eformer's create_mesh over `devices`: `dims` are reshaped with numpy rules (one -1 takes
  /// the rest), `names` name the axes.
  /// Throws: ValueError when names and dims differ in length, a name repeats, two dims are -1,
  /// or the dims do not fit the device count (the message names the dims, the device count and
  /// the placement that made them).
  static DeviceMesh create(std::shared_ptr<DeviceSet> devices,
                           const std::vector<std::int64_t>& dims,
                           const std::vector<std::string>& names);

  /// The logical mesh (axis names and sizes).
  const sharding::Mesh& mesh() const noexcept { return mesh_; }
  /// Number of mesh slots (= devices).
  std::int64_t size() const noexcept { return mesh_.size(); }
  /// The devices.
  DeviceSet& devices() const noexcept { return *devices_; }
  /// The shared device set.
  const std::shared_ptr<DeviceSet>& device_set() const noexcept { return devices_; }
  /// The device at mesh slot `slot`. Throws: IndexError naming the slot and the mesh size.
  Device& device(std::int64_t slot) const;
  /// Mesh coordinates of `slot`. Throws: IndexError.
  std::vector<std::int64_t> coords(std::int64_t slot) const;

  /// Device groups along `axes`: the slots that differ only in their coordinates on `axes`,
  /// one group per combination of the other axes' coordinates. Each group lists its slots in
  /// row-major order over `axes` *in mesh order* (so rank r of a group is its r-th slot);
  /// groups are ordered by their first slot. `axes` empty gives one group per slot.
  /// Example: mesh (dp=2, tp=2): groups({"tp"}) = {{0,1},{2,3}}, groups({"dp"}) =
  /// {{0,2},{1,3}}, groups({"dp","tp"}) = {{0,1,2,3}}.
  /// Throws: KeyError naming an axis the mesh lacks (and listing the mesh's axes);
  /// ValueError when an axis repeats.
  std::vector<std::vector<std::int64_t>> groups(std::span<const std::string> axes) const;

  /// "DeviceMesh('dp': 2, 'tp': 2) over 4 devices (numa policy)".
  std::string to_string() const;

 private:
  std::shared_ptr<DeviceSet> devices_;
  sharding::Mesh mesh_;
};

}  // namespace numesh::runtime
