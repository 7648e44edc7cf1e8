#pragma once

// `numesh op mlp|attention|moe|block`: one layer run on weights and inputs read from a folder
// of .npy files (names in docs/ops.md), sharded over a mesh of this machine (or a synthetic or
// XML topology), in a chosen mode. Prints the plan and the time, checks the output against the
// dense reference and writes it as .npy.

#include <iosfwd>

#include "op_options.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace numesh::tools {

/// Registers `op`. Not thread-safe (CLI11 setup).
CLI::App* add_op_command(CLI::App& app, OpOptions& options);

/// Runs the layer (its ops::layer_table() entry); writes the report to `out` and y.npy to the
/// output folder. Returns 0, or 1 when the check against the dense reference fails. Throws:
/// ValueError naming an op the table does not hold; IoError naming every missing input file;
/// ValueError / ShapeError naming bad options or shapes; all before anything runs.
int run_op(const OpOptions& options, std::ostream& out);

}  // namespace numesh::tools
