#pragma once

// The hwloc XML exports of real machines in tests/data/topologies, for the runtime tests (their
// target defines NUMESH_TOPOLOGY_DIR as that folder).

#include <string>

#include "numesh/runtime/topology.hpp"

namespace numesh::runtime::testing {

/// The topology of the export tests/data/topologies/`name`.
/// Throws: what Topology::from_xml throws (a missing or malformed file).
inline Topology topology_fixture(const std::string& name) {
  return Topology::from_xml(std::string(NUMESH_TOPOLOGY_DIR) + "/" + name);
}

}  // namespace numesh::runtime::testing
