// MPI's own collectives, the baseline of numesh's across ranks (mpi_collective.hpp). Besides
// runtime/src/mpi_transport.cpp, the one source of the project that includes mpi.h.

#include "numesh/diagnostics/mpi_collective.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "collective_values.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::diagnostics {

namespace {

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(
      fmt::format("{} failed: {}", call, std::string(text, static_cast<std::size_t>(length))));
}

// Finalises MPI at exit when this file initialised it: a static made before mpi_world()'s, so
// destroyed after it, once the transport has closed.
struct FinalizeAtExit {
  bool finalize = false;
  ~FinalizeAtExit() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalize && finalized == 0) MPI_Finalize();
  }
};

}  // namespace

bool has_mpi_collective() noexcept { return true; }

std::shared_ptr<runtime::Transport> mpi_world_for_baselines() {
  static FinalizeAtExit at_exit;
  int initialised = 0;
  check_mpi(MPI_Initialized(&initialised), "MPI_Initialized");
  if (initialised == 0) {
    int provided = 0;
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    at_exit.finalize = true;
  }
  return runtime::mpi_world();  // refuses a level below MPI_THREAD_MULTIPLE, naming it
}

struct MpiCollective::State {
  CollectiveOp op;
  DType dtype;
  std::size_t ranks = 1;
  std::size_t rank = 0;
  std::size_t count = 0;
  std::vector<std::byte> in, out;
};

MpiCollective::MpiCollective(CollectiveOp op, std::size_t bytes, DType dtype)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  int size = 0, rank = 0;
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
  s.op = op;
  s.dtype = dtype;
  s.ranks = static_cast<std::size_t>(size);
  s.rank = static_cast<std::size_t>(rank);
  s.count = detail::element_count(op, bytes, s.ranks, dtype);
  NUMESH_CHECK(
      dtype == DType::kF32 || op == CollectiveOp::kAllGather || op == CollectiveOp::kAllToAll,
      NotImplementedError,
      "MPI's {} of {}: MPI has no {} arithmetic, so its reductions are timed in f32 only",
      to_string(op), to_string(dtype), to_string(dtype));
  const std::size_t item = dtype_size(dtype);
  s.in.resize(s.count * item);
  s.out.resize(detail::output_count(op, s.count, s.ranks) * item);
  detail::fill_inputs(s.in.data(), dtype, s.count, s.rank);
}

MpiCollective::~MpiCollective() = default;

void MpiCollective::run() {
  State& s = *state_;
  // Copies move elements as bytes of their size; reductions are f32 (checked above).
  const MPI_Datatype type = s.dtype == DType::kF32 ? MPI_FLOAT : MPI_UINT16_T;
  const auto count = static_cast<int>(s.count);
  const auto per_rank = static_cast<int>(s.count / s.ranks);
  switch (s.op) {
    case CollectiveOp::kAllReduce:
      check_mpi(MPI_Allreduce(s.in.data(), s.out.data(), count, type, MPI_SUM, MPI_COMM_WORLD),
                "MPI_Allreduce");
      break;
    case CollectiveOp::kAllGather:
      check_mpi(MPI_Allgather(s.in.data(), count, type, s.out.data(), count, type, MPI_COMM_WORLD),
                "MPI_Allgather");
      break;
    case CollectiveOp::kReduceScatter:
      check_mpi(MPI_Reduce_scatter_block(s.in.data(), s.out.data(), per_rank, type, MPI_SUM,
                                         MPI_COMM_WORLD),
                "MPI_Reduce_scatter_block");
      break;
    case CollectiveOp::kAllToAll:
      check_mpi(
          MPI_Alltoall(s.in.data(), per_rank, type, s.out.data(), per_rank, type, MPI_COMM_WORLD),
          "MPI_Alltoall");
      break;
  }
}

bool MpiCollective::check() const {
  const State& s = *state_;
  const std::size_t which[] = {s.rank};
  return detail::check_outputs(
      s.op, s.count, s.ranks, s.dtype, [&s](std::size_t) { return s.out.data(); }, which);
}

}  // namespace numesh::diagnostics
