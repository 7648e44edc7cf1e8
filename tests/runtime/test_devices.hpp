#pragma once

// Shared by the runtime tests: device sets made from synthetic topologies (unpinned, one thread
// per device so that 8 devices stay cheap on a 2-core machine), cached per description so the
// tests do not create hundreds of arenas.

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "numesh/runtime/cancellation.hpp"
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

/// Cancels a call in the middle of its first graph, deterministically: holds `device`'s only
/// thread with a task of its own until `source` has begun a graph run, then cancels the source
/// and lets the device go. That run has begun and none of its nodes on `device` has run, so it
/// stops part-way. Construct before the call under `source` (the constructor returns once the
/// device is held); destroy after it. Requires: a one-thread device (synthetic_devices'), and a
/// warm call (one that runs nothing on the device before its first graph).
class CancelMidRun {
 public:
  CancelMidRun(Device& device, CancelSource& source)
      : holder_([this, &device, &source] {
          device.execute([&] {
            held_ = true;
            // Bounded: a call that needs the held device before its first graph (a cold one
            // allocating or compiling) would otherwise wait for it forever; after a minute
            // the cancel comes late and the test's expectations fail instead of hanging.
            const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(1);
            while (source.runs_begun() == 0 && !abandoned_ &&
                   std::chrono::steady_clock::now() < give_up) {
              std::this_thread::yield();
            }
            source.cancel();
          });
        }) {
    while (!held_) std::this_thread::yield();
  }
  /// Lets the device go (cancelling anyway) if the call began no graph.
  ~CancelMidRun() {
    abandoned_ = true;
    holder_.join();
  }
  CancelMidRun(const CancelMidRun&) = delete;
  CancelMidRun& operator=(const CancelMidRun&) = delete;

 private:
  std::atomic<bool> held_{false}, abandoned_{false};
  std::thread holder_;
};

/// A [dp, tp] = [2, 2] mesh over two packages of two one-core NUMA nodes.
inline DeviceMesh mesh_2x2() {
  return DeviceMesh::create(synthetic_devices("package:2 numa:2 core:1 pu:1"), {2, 2},
                            {"dp", "tp"});
}

}  // namespace numesh::runtime::testing
