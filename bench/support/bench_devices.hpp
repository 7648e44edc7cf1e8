#pragma once

// The devices the Google Benchmark programs run on: this machine cut by NUMESH_BENCH_POLICY
// (numa, l3 or core; default core, so that a one-node machine still has one device per core),
// made once per process and recorded in the benchmark context.

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "numesh/runtime/device.hpp"

namespace numesh::bench {

/// The benchmark devices (see the file comment).
inline std::shared_ptr<runtime::DeviceSet> bench_devices() {
  static const std::shared_ptr<runtime::DeviceSet> devices = [] {
    const char* env = std::getenv("NUMESH_BENCH_POLICY");
    runtime::PlacementOptions options;
    options.policy = runtime::parse_placement_policy(env != nullptr ? env : "core");
    auto set = runtime::DeviceSet::create(runtime::Topology::discover(), options);
    std::string text;
    for (std::size_t i = 0; i < set->size(); ++i) {
      const auto& d = set->device(i);
      text += fmt::format("{}{} (cpus {}, {})", i == 0 ? "" : ", ", d.spec().label,
                          d.spec().cpuset.to_string(), runtime::to_string(d.pinning()));
    }
    benchmark::AddCustomContext("numesh_devices", text);
    return set;
  }();
  return devices;
}

}  // namespace numesh::bench
