#pragma once

// Shared by the runtime tests: device sets made from synthetic topologies (unpinned, one thread
// per device so that 8 devices stay cheap on a 2-core machine), cached per description so the
// tests do not create hundreds of arenas.

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "numesh/runtime/device.hpp"
#include "numesh/runtime/device_mesh.hpp"

namespace numesh::runtime::testing {

/// The device set of a synthetic topology, one thread per device, made once per process.
inline std::shared_ptr<DeviceSet> synthetic_devices(const std::string& description) {
  static std::mutex m;
  static std::map<std::string, std::shared_ptr<DeviceSet>> cache;
  const std::lock_guard lock(m);
  auto& slot = cache[description];
  if (!slot) {
    PlacementOptions options;
    options.max_threads_per_device = 1;
    slot = DeviceSet::create(Topology::from_synthetic(description), options);
  }
  return slot;
}

/// A synthetic topology with `n` NUMA nodes of one core each (n devices under the numa policy).
inline std::string nodes(int n) { return "numa:" + std::to_string(n) + " core:1 pu:1"; }

}  // namespace numesh::runtime::testing
