// main() of the test programs that mpirun starts (tests/runtime_mpi): it makes the world first
// (MPI is initialised on the main thread), lets rank 0 alone print all of GoogleTest's results
// (the others their failures), and gives every rank the exit code of the worst rank, gathered
// over the transport itself.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <memory>
#include <vector>

#include "numesh/runtime/transport.hpp"

int main(int argc, char** argv) {
  const std::shared_ptr<numesh::runtime::Transport> world = numesh::runtime::mpi_world();
  // Ranks other than 0 print their failures only (GoogleTest's brief mode, chosen at init).
  if (world->rank() != 0) GTEST_FLAG_SET(brief, true);
  ::testing::InitGoogleMock(&argc, argv);
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  // Every rank's result; a failing rank other than 0 says which it is.
  const auto mine = static_cast<std::byte>(failed);
  std::vector<std::byte> all(static_cast<std::size_t>(world->size()));
  world->all_gather({&mine, 1}, all);
  if (failed != 0 && world->rank() != 0) {
    std::fprintf(stderr, "rank %d: the failures above are this rank's\n", world->rank());
  }
  return std::any_of(all.begin(), all.end(), [](std::byte b) { return b != std::byte{0}; }) ? 1 : 0;
}
