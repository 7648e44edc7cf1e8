// numesh: the command-line program. Subcommands:
//   numesh resolve ...   semantic axes -> PartitionSpec -> corrected spec -> device layout
//
// Exit status: 0 on success; 2 on any bad input (CLI11 parse errors included), reported as one
// line `numesh: error: ...` on stderr naming the offending value.

#include <CLI/CLI.hpp>

#include <iostream>

#include "numesh/core/error.hpp"
#include "resolve_command.hpp"

#ifndef NUMESH_VERSION
#define NUMESH_VERSION "unknown"
#endif

namespace {

constexpr int kBadInput = 2;

int fail(const std::string& message) {
  std::cerr << "numesh: error: " << message << "\n";
  return kBadInput;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"numesh: a NUMA task-graph runtime with eformer-compatible sharding.", "numesh"};
  app.set_version_flag("--version", "numesh " NUMESH_VERSION);
  app.require_subcommand(1);
  numesh::tools::ResolveOptions resolve;
  CLI::App* resolve_cmd = numesh::tools::add_resolve_command(app, resolve);

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help / --version
  } catch (const CLI::ParseError& e) {
    return fail(e.what());
  }

  try {
    if (resolve_cmd->parsed()) numesh::tools::run_resolve(resolve, std::cout);
  } catch (const numesh::Error& e) {
    return fail(e.what());
  }
  return 0;
}
