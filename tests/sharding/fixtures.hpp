#pragma once

// Shared by the sharding tests: the mesh most of them place arrays on, and pytree leaves.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/named_array.hpp"

namespace numesh::sharding::fixtures {

/// Mesh('dp': 2, 'tp': 4): device = dp * 4 + tp.
inline const Mesh kDpTp({"dp", "tp"}, {2, 4});

/// A pytree leaf at `path` holding an array of `shape` and `dtype`.
inline NamedLeaf leaf(std::string path, std::vector<std::int64_t> shape,
                      std::string dtype = "float32") {
  return NamedLeaf{std::move(path), ArrayInfo{std::move(shape), std::move(dtype)}};
}

}  // namespace numesh::sharding::fixtures
