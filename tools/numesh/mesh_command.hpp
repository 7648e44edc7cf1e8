#pragma once

// `numesh mesh`: which device sits at which mesh coordinate, and the device groups of each
// mesh axis.

#include <iosfwd>

#include "mesh_options.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace numesh::tools {

/// The options of `numesh mesh`.
struct MeshCommandOptions {
  /// Topology, placement, --dims (e.g. "2,-1") and --names (e.g. "dp,tp"); by default one
  /// axis, dp, over every device.
  MeshOptions mesh{.machine = {}, .dims = "-1", .names = "dp"};
  bool json = false;  ///< --json
};

/// Registers the `mesh` subcommand. Not thread-safe (CLI11 setup).
CLI::App* add_mesh_command(CLI::App& app, MeshCommandOptions& options);

/// Builds the devices and the mesh (make_mesh) and writes the report to `out`.
/// Throws: numesh::Error naming the bad value (dims that do not fit, a bad policy, ...).
void run_mesh(const MeshCommandOptions& options, std::ostream& out);

}  // namespace numesh::tools
