#pragma once

// Shared by the ops tests: seeded random host tensors. Devices come from
// ../runtime/test_devices.hpp (synthetic topologies, one thread per device, cached).

#include <cstdint>
#include <random>
#include <vector>

#include "numesh/runtime/tensor.hpp"

namespace numesh::ops::testing {

/// A [shape] tensor of normal(0, scale) values from a seeded generator.
inline runtime::HostTensor random_host(std::vector<std::int64_t> shape, std::uint32_t seed,
                                       float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  runtime::HostTensor t = runtime::HostTensor::zeros(std::move(shape));
  for (float& v : t.data) v = normal(rng);
  return t;
}

}  // namespace numesh::ops::testing
