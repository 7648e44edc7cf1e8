#pragma once

// The options every machine-facing command shares: which topology (this machine, a synthetic
// description or an XML file) and how to cut it into devices.

#include <optional>
#include <string>

#include "numesh/runtime/placement.hpp"
#include "numesh/runtime/topology.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace numesh::tools {

/// --synthetic / --xml / --policy / --smt / --threads, as given on the command line.
struct MachineOptions {
  std::optional<std::string> synthetic;  ///< --synthetic DESC, e.g. "package:2 numa:2 core:8 pu:2".
  std::optional<std::string> xml;        ///< --xml FILE (an `lstopo --of xml` export).
  std::string policy = "numa";           ///< --policy: numa, l3 or core.
  bool smt = false;                      ///< --smt: one thread per PU instead of per core.
  int max_threads = 0;                   ///< --threads N: cap per device (0 = no cap).
};

/// Registers the options on `cmd`; --synthetic and --xml exclude each other. `with_threads`
/// adds --threads. Not thread-safe (CLI11 setup).
void add_machine_options(CLI::App& cmd, MachineOptions& options, bool with_threads);

/// The topology the options name (the running machine when neither --synthetic nor --xml).
/// Throws: TopologyError naming the description or file.
runtime::Topology load_topology(const MachineOptions& options);

/// The placement the options name. Throws: ValueError for a bad --policy or a negative
/// --threads (naming the value); `explicit` is refused (it needs cpusets the CLI does not take).
runtime::PlacementOptions placement_options(const MachineOptions& options);

}  // namespace numesh::tools
