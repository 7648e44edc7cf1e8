#pragma once

// `numesh mesh`: which device sits at which mesh coordinate, and the device groups of each
// mesh axis.

#include <iosfwd>
#include <string>

#include "machine_options.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace numesh::tools {

/// The options of `numesh mesh`.
struct MeshOptions {
  MachineOptions machine;              ///< topology and placement
  std::string dims = "-1";             ///< --dims, e.g. "2,-1"
  std::string names = "dp";            ///< --names, e.g. "dp,tp"
  bool json = false;                   ///< --json
};

/// Registers the `mesh` subcommand. Not thread-safe (CLI11 setup).
CLI::App* add_mesh_command(CLI::App& app, MeshOptions& options);

/// Builds the devices and the mesh and writes the report to `out`.
/// Throws: numesh::Error naming the bad value (dims that do not fit, a bad policy, ...).
void run_mesh(const MeshOptions& options, std::ostream& out);

}  // namespace numesh::tools
