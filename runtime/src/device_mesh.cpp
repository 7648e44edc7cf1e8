#include "numesh/runtime/device_mesh.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::runtime {

DeviceMesh DeviceMesh::create(std::shared_ptr<DeviceSet> devices,
                              const std::vector<std::int64_t>& dims,
                              const std::vector<std::string>& names) {
  NUMESH_CHECK(devices != nullptr, ValueError, "DeviceMesh::create needs a device set");
  NUMESH_CHECK(dims.size() == names.size(), ValueError,
               "mesh dims ({}) and names ({}) differ in length: {} dims, {} names",
               fmt::join(dims, ","), fmt::join(names, ","), dims.size(), names.size());
  const auto n = static_cast<std::int64_t>(devices->size());
  std::vector<std::int64_t> resolved;
  try {
    resolved = sharding::resolve_mesh_dims(dims, n);
  } catch (const ValueError& e) {
    std::vector<std::string> labels;
    for (std::size_t i = 0; i < devices->size(); ++i)
      labels.push_back(devices->device(i).spec().label);
    throw ValueError(
        fmt::format("mesh dims ({}) do not fit the {} devices the {} placement made ({}): {}",
                    fmt::join(dims, ","), n, runtime::to_string(devices->options().policy),
                    fmt::join(labels, ", "), e.what()));
  }
  DeviceMesh mesh;
  mesh.devices_ = std::move(devices);
  mesh.mesh_ = sharding::Mesh(names, resolved);
  return mesh;
}

Device& DeviceMesh::device(std::int64_t slot) const {
  NUMESH_CHECK(slot >= 0 && slot < size(), IndexError,
               "mesh slot {} is out of range: the mesh has {} devices", slot, size());
  return devices_->device(static_cast<std::size_t>(slot));
}

std::vector<std::int64_t> DeviceMesh::coords(std::int64_t slot) const {
  NUMESH_CHECK(slot >= 0 && slot < size(), IndexError,
               "mesh slot {} is out of range: the mesh has {} devices", slot, size());
  return mesh_.coords_of(slot);
}

std::vector<std::vector<std::int64_t>> DeviceMesh::groups(std::span<const std::string> axes) const {
  std::vector<bool> in_group(mesh_.rank(), false);
  for (const std::string& axis : axes) {
    const auto index = mesh_.find_axis(axis);
    if (!index) {
      throw KeyError(axis, fmt::format("mesh axis '{}' is not in the mesh (axes: {})", axis,
                                       fmt::join(mesh_.names(), ", ")));
    }
    NUMESH_CHECK(!in_group[*index], ValueError, "mesh axis '{}' is given twice in ({})", axis,
                 fmt::join(axes, ", "));
    in_group[*index] = true;
  }
  // Key each slot by its coordinates on the other axes; slots iterate in row-major order, so
  // within a key they arrive in row-major order over the group axes.
  std::vector<std::vector<std::int64_t>> groups;
  std::vector<std::vector<std::int64_t>> keys;
  for (std::int64_t slot = 0; slot < size(); ++slot) {
    const std::vector<std::int64_t> c = mesh_.coords_of(slot);
    std::vector<std::int64_t> key;
    for (std::size_t a = 0; a < c.size(); ++a) {
      if (!in_group[a]) key.push_back(c[a]);
    }
    auto it = std::find(keys.begin(), keys.end(), key);
    if (it == keys.end()) {
      keys.push_back(std::move(key));
      groups.push_back({slot});
    } else {
      groups[static_cast<std::size_t>(it - keys.begin())].push_back(slot);
    }
  }
  return groups;
}

std::string DeviceMesh::to_string() const {
  return fmt::format("Device{} over {} devices ({} policy)", mesh_.repr(), size(),
                     runtime::to_string(devices_->options().policy));
}

}  // namespace numesh::runtime
