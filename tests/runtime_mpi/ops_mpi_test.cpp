// Programs on meshes that span processes (tests/ops/across_ranks.hpp): run by CTest as
// `mpirun -np N ops_mpi_test` for N = 2, 4, every rank one process with devices of its own,
// checking that the transformer stack and a training step give the bits of one process.

#include <gtest/gtest.h>

#include "across_ranks.hpp"
#include "numesh/runtime/transport.hpp"

namespace numesh::ops {
namespace {

TEST(OpsMpiTest, TheTransformerStackGivesTheBitsOfOneProcess) {
  ASSERT_FALSE(across_ranks::ranked_meshes(runtime::mpi_world()->size()).empty())
      << "no mesh to test on " << runtime::mpi_world()->size() << " ranks";
  across_ranks::transformer_matches_one_process(runtime::mpi_world());
}

TEST(OpsMpiTest, ATrainingStepGivesTheBitsOfOneProcess) {
  ASSERT_FALSE(across_ranks::ranked_meshes(runtime::mpi_world()->size()).empty())
      << "no mesh to test on " << runtime::mpi_world()->size() << " ranks";
  across_ranks::training_step_matches_one_process(runtime::mpi_world());
}

}  // namespace
}  // namespace numesh::ops
