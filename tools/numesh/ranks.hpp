#pragma once

// The ranks of a command that mpirun started (docs/distributed.md): the transport between them,
// the start-up check that every rank was given the same options, set-up that fails on every
// rank together, and the output that rank 0 alone writes. Without mpirun, one rank of one.

#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "numesh/runtime/transport.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace numesh::tools {

/// The transport between the ranks of this run: Open MPI's world when mpirun started more than
/// one rank (initialised on first use with MPI_THREAD_MULTIPLE, so that a benchmark may time
/// MPI's own collectives beside it), else a transport of one rank. Call it first from the main
/// thread. Throws: what diagnostics::mpi_world_for_baselines throws.
const std::shared_ptr<runtime::Transport>& command_world();

/// Compares every option of the parsed command `app` (its name, and its values as given, or
/// "(not given)") over the ranks of command_world(). Collective.
/// Throws: ValueError naming each option whose values differ and each rank's value
/// (check_same_on_every_rank); what the transport throws.
void check_options_on_every_rank(const CLI::App& app);

/// Runs `setup` on every rank of `world`; when it throws a numesh::Error on any rank, every rank
/// throws a ValueError naming each failing rank and its message ("rank 0: --json: cannot write
/// ..."). A rank that stopped alone would leave the others waiting for it in their next
/// collective step. Collective.
void on_every_rank(runtime::Transport& world, const std::function<void()>& setup);

/// Throws an Error on every rank of `world` when `ok` is false on any, naming `what` and the
/// ranks ("... gave a wrong result on rank(s) 1"). Collective.
void check_on_every_rank(runtime::Transport& world, bool ok, const std::string& what);

/// `out` on rank 0 of command_world(), a stream that discards everything on the other ranks:
/// a command's output comes from rank 0 alone.
std::ostream& rank0_stream(std::ostream& out);

}  // namespace numesh::tools
