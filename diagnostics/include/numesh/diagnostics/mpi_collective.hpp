#pragma once

// Open MPI's own collectives as the baseline of numesh's collectives across ranks
// (docs/distributed.md): `numesh bench collectives` under mpirun times both on the same ranks
// and buffers. Built with NUMESH_WITH_MPI; without it has_mpi_collective() is false and the
// constructors say so.

#include <cstddef>
#include <memory>

#include "numesh/core/dtype.hpp"
#include "numesh/diagnostics/collective_benchmark.hpp"
#include "numesh/runtime/transport.hpp"

namespace numesh::diagnostics {

/// True when this build can run MPI's own collectives (NUMESH_WITH_MPI).
[[nodiscard]] bool has_mpi_collective() noexcept;

/// The transport over MPI's world for a program that also times MPI's own collectives: MPI is
/// initialised here with MPI_THREAD_MULTIPLE (the caller's thread calls MPI beside the
/// transport's progress thread) unless the program already did, and finalised at exit when
/// initialised here. Call it first, from the main thread, instead of runtime::mpi_world().
/// Throws: NotImplementedError without MPI; Error when MPI cannot start or lacks the level.
std::shared_ptr<runtime::Transport> mpi_world_for_baselines();

/// One of MPI's collectives over MPI_COMM_WORLD with one buffer of `bytes` per rank (the
/// bytes numesh's benchmark gives each device; all-gather's output is ranks times larger,
/// reduce-scatter's ranks times smaller), holding the known inputs of GraphCollective so that
/// check() verifies the outputs: MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block and
/// MPI_Alltoall, sum for the reductions. MPI has no bf16 or f16 arithmetic, so it reduces f32
/// only; it copies any element type. Every rank constructs and runs it together.
/// Thread-safety: one run() at a time; MPI must allow calls from this thread
/// (mpi_world_for_baselines()).
class MpiCollective {
 public:
  /// Throws: ValueError as GraphCollective over the world's ranks; NotImplementedError for a
  /// 16-bit reduction (naming it) or without MPI.
  MpiCollective(CollectiveOp op, std::size_t bytes, DType dtype = DType::kF32);
  ~MpiCollective();
  MpiCollective(const MpiCollective&) = delete;
  MpiCollective& operator=(const MpiCollective&) = delete;

  /// Runs the collective once. Throws: Error naming the MPI call and MPI's message.
  void run();
  /// True when this rank's output holds the expected values. Call after run().
  [[nodiscard]] bool check() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace numesh::diagnostics
