#pragma once

// `numesh topology`: the machine (or a synthetic or XML topology) as numesh sees it, the
// devices a placement policy makes of it, the NUMA distances and what cannot be done.

#include <iosfwd>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "mesh_options.hpp"
#include "numesh/runtime/device_placement.hpp"
#include "numesh/runtime/topology.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace numesh::tools {

/// The options of `numesh topology`, as given on the command line (checked by run_topology,
/// so that every bad value is reported as a numesh::Error naming it).
struct TopologyOptions {
  MachineOptions machine;  ///< --synthetic / --xml / --policy / --smt
  bool json = false;       ///< --json.
};

/// Registers the `topology` subcommand on `app`, writing into `options`. --synthetic and --xml
/// exclude each other; without either the running machine is loaded. Not thread-safe (CLI11
/// setup).
CLI::App* add_topology_command(CLI::App& app, TopologyOptions& options);

/// Loads the topology, places devices and writes the report (text or JSON) to `out`.
/// Throws: ValueError for a bad --policy (explicit included: it needs cpusets this command does
/// not take); TopologyError when the topology cannot be loaded (naming the description or file).
void run_topology(const TopologyOptions& options, std::ostream& out);

/// The report as JSON: source, origin, can_bind, cpuset, packages, numa_nodes, l3_groups,
/// cores, policy, smt, devices, distances {origin, size, values (rows)}, notes (the topology's,
/// then the placement's). Cpusets are strings in list syntax ("0-3,8").
nlohmann::json topology_json(const runtime::Topology& topology,
                             const runtime::PlacementOptions& placement,
                             const std::vector<runtime::DeviceSpec>& devices,
                             const std::vector<std::string>& notes);

/// The report as text: a header, the machine as a tree (packages, NUMA nodes with their memory,
/// L3 groups, cores with their PUs), the devices, the distance matrix with its origin and the
/// notes. Not thread-safe on the same stream.
void render_topology_text(const runtime::Topology& topology,
                          const runtime::PlacementOptions& placement,
                          const std::vector<runtime::DeviceSpec>& devices,
                          const std::vector<std::string>& notes, std::ostream& out);

}  // namespace numesh::tools
