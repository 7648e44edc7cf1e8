// A build without MPI (NUMESH_WITH_MPI off): the baseline of MPI's own collectives says so.

#include "numesh/core/error.hpp"
#include "numesh/diagnostics/mpi_collective.hpp"

namespace numesh::diagnostics {

namespace {
constexpr const char* kNoMpi =
    "MPI's own collectives: this numesh was built without MPI (NUMESH_WITH_MPI=OFF)";
}  // namespace

bool has_mpi_collective() noexcept { return false; }

std::shared_ptr<runtime::Transport> mpi_world_for_baselines() { throw NotImplementedError(kNoMpi); }

struct MpiCollective::State {};

MpiCollective::MpiCollective(CollectiveOp, std::size_t, DType) {
  throw NotImplementedError(kNoMpi);
}
MpiCollective::~MpiCollective() = default;
void MpiCollective::run() { throw NotImplementedError(kNoMpi); }
bool MpiCollective::check() const { throw NotImplementedError(kNoMpi); }

}  // namespace numesh::diagnostics
