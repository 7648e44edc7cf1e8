#pragma once

// The meshes of the models' tests and PyTorch checks (hf_model_check_main, train_check_main),
// built over synthetic NUMA nodes, one per device.

#include <cstdint>
#include <string>
#include <vector>

#include "../runtime/test_devices.hpp"
#include "numesh/runtime/device_mesh.hpp"

namespace numesh::models::testing {

/// A mesh to run a check on: a label for the report, dims and axis names.
struct MeshChoice {
  std::string label;
  std::vector<std::int64_t> dims;
  std::vector<std::string> names;
};

/// The mesh of `m` over as many synthetic NUMA nodes as it has devices.
inline runtime::DeviceMesh make_mesh(const MeshChoice& m) {
  std::int64_t n = 1;
  for (std::int64_t d : m.dims) n *= d;
  return runtime::DeviceMesh::create(
      runtime::testing::synthetic_devices(runtime::testing::nodes(static_cast<int>(n))), m.dims,
      m.names);
}

/// A one-axis mesh named `names[0]` over `devices` synthetic NUMA nodes.
inline runtime::DeviceMesh mesh_of(int devices, std::vector<std::string> names) {
  return runtime::DeviceMesh::create(
      runtime::testing::synthetic_devices(runtime::testing::nodes(devices)),
      {static_cast<std::int64_t>(devices)}, std::move(names));
}

}  // namespace numesh::models::testing
