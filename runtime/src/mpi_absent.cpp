// The MPI entry points of a build without MPI (NUMESH_WITH_MPI off): mpi_world() says so.

#include <cstdio>
#include <cstdlib>

#include "numesh/core/error.hpp"
#include "numesh/runtime/transport.hpp"

namespace numesh::runtime {

bool has_mpi() noexcept { return false; }

std::shared_ptr<Transport> mpi_world() {
  throw NotImplementedError(
      "this numesh was built without MPI (configure with -DNUMESH_WITH_MPI=ON and Open MPI's "
      "headers, Debian's libopenmpi-dev)");
}

void abort_mpi_world(int code) noexcept {
  std::fflush(nullptr);
  std::_Exit(code);
}

}  // namespace numesh::runtime
