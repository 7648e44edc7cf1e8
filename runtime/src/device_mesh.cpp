#include "numesh/runtime/device_mesh.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/runtime/shared_windows.hpp"
#include "numesh/runtime/transport.hpp"

namespace numesh::runtime {

DeviceMesh DeviceMesh::create(std::shared_ptr<DeviceSet> devices,
                              const std::vector<std::int64_t>& dims,
                              const std::vector<std::string>& names) {
  NUMESH_CHECK(devices != nullptr, ValueError, "DeviceMesh::create needs a device set");
  const auto n = static_cast<std::int64_t>(devices->size());
  // One process: every mesh shares one transport of rank 0 of 1.
  static const auto single = std::make_shared<SingleProcessTransport>();
  return over_ranks(std::move(devices), single, 0, {n}, dims, names);
}

DeviceMesh DeviceMesh::create(std::shared_ptr<DeviceSet> local,
                              std::shared_ptr<Transport> transport,
                              const std::vector<std::int64_t>& dims,
                              const std::vector<std::string>& names) {
  NUMESH_CHECK(local != nullptr, ValueError, "DeviceMesh::create needs a device set");
  NUMESH_CHECK(transport != nullptr, ValueError, "DeviceMesh::create needs a transport");
  const auto mine = static_cast<std::int64_t>(local->size());
  std::vector<std::int64_t> counts(static_cast<std::size_t>(transport->size()));
  transport->all_gather(std::as_bytes(std::span(&mine, 1)),
                        std::as_writable_bytes(std::span(counts)));
  for (std::size_t r = 0; r < counts.size(); ++r) {
    NUMESH_CHECK(counts[r] > 0, ValueError,
                 "rank {} of {} has no device: every rank of a mesh needs one", r, counts.size());
  }
  const int rank = transport->rank();
  std::shared_ptr<SharedWindows> windows =
      transport->size() > 1 ? SharedWindows::open(transport, *local) : nullptr;
  DeviceMesh mesh = over_ranks(std::move(local), std::move(transport), rank, counts, dims, names);
  mesh.windows_ = std::move(windows);
  return mesh;
}

DeviceMesh DeviceMesh::over_ranks(std::shared_ptr<DeviceSet> local,
                                  std::shared_ptr<Transport> transport, int this_rank,
                                  const std::vector<std::int64_t>& counts,
                                  const std::vector<std::int64_t>& dims,
                                  const std::vector<std::string>& names) {
  NUMESH_CHECK(dims.size() == names.size(), ValueError,
               "mesh dims ({}) and names ({}) differ in length: {} dims, {} names",
               fmt::join(dims, ","), fmt::join(names, ","), dims.size(), names.size());
  std::vector<std::int64_t> first{0};
  for (std::int64_t c : counts) first.push_back(first.back() + c);
  const std::int64_t n = first.back();
  std::vector<std::int64_t> resolved;
  try {
    resolved = sharding::resolve_mesh_dims(dims, n);
  } catch (const ValueError& e) {
    std::vector<std::string> labels;
    for (std::size_t i = 0; i < local->size(); ++i) labels.push_back(local->device(i).spec().label);
    if (counts.size() == 1) {
      throw ValueError(
          fmt::format("mesh dims ({}) do not fit the {} devices the {} placement made ({}): {}",
                      fmt::join(dims, ","), n, runtime::to_string(local->options().policy),
                      fmt::join(labels, ", "), e.what()));
    }
    std::vector<std::string> per_rank;
    for (std::size_t r = 0; r < counts.size(); ++r) {
      per_rank.push_back(fmt::format("rank {}: {}", r, counts[r]));
    }
    throw ValueError(fmt::format(
        "mesh dims ({}) do not fit the {} devices of {} ranks ({}; this rank's {} placement "
        "made {}): {}",
        fmt::join(dims, ","), n, counts.size(), fmt::join(per_rank, ", "),
        runtime::to_string(local->options().policy), fmt::join(labels, ", "), e.what()));
  }
  DeviceMesh mesh;
  mesh.devices_ = std::move(local);
  mesh.transport_ = std::move(transport);
  mesh.mesh_ = sharding::Mesh(names, resolved);
  mesh.this_rank_ = this_rank;
  mesh.first_slot_of_rank_ = std::move(first);
  const auto r = static_cast<std::size_t>(this_rank);
  for (std::int64_t slot = mesh.first_slot_of_rank_[r]; slot < mesh.first_slot_of_rank_[r + 1];
       ++slot) {
    mesh.local_slots_.push_back(slot);
  }
  return mesh;
}

int DeviceMesh::rank_of(std::int64_t slot) const {
  NUMESH_CHECK(slot >= 0 && slot < size(), IndexError,
               "mesh slot {} is out of range: the mesh has {} devices", slot, size());
  // The first rank whose slots end after `slot`.
  const auto it =
      std::upper_bound(first_slot_of_rank_.begin() + 1, first_slot_of_rank_.end(), slot);
  return static_cast<int>(it - first_slot_of_rank_.begin()) - 1;
}

Device& DeviceMesh::device(std::int64_t slot) const {
  const int rank = rank_of(slot);
  NUMESH_CHECK(rank == this_rank_, ValueError,
               "mesh slot {} is a device of rank {}: this process (rank {}) holds slots {}-{}",
               slot, rank, this_rank_, local_slots_.front(), local_slots_.back());
  return devices_->device(static_cast<std::size_t>(slot - local_slots_.front()));
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
  if (ranks() == 1) {
    return fmt::format("Device{} over {} devices ({} policy)", mesh_.repr(), size(),
                       runtime::to_string(devices_->options().policy));
  }
  return fmt::format(
      "Device{} over {} devices on {} ranks ({} policy; this is rank {}, slots "
      "{}-{})",
      mesh_.repr(), size(), ranks(), runtime::to_string(devices_->options().policy), this_rank_,
      local_slots_.front(), local_slots_.back());
}

}  // namespace numesh::runtime
