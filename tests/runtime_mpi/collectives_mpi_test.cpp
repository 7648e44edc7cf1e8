// Collectives on meshes that span processes (tests/runtime/collectives_across_ranks.hpp): run by
// CTest as `mpirun -np N collectives_mpi_test` for N = 2, 4, every rank one process with devices
// of its own, checking that every collective gives the bits one process gives on the same mesh.

#include <gtest/gtest.h>

#include <memory>

#include "collectives_across_ranks.hpp"
#include "numesh/runtime/transport.hpp"

namespace numesh::runtime {
namespace {

TEST(CollectivesMpiTest, BufferCollectivesGiveTheBitsOfOneProcess) {
  ASSERT_FALSE(across_ranks::ranked_meshes(mpi_world()->size()).empty())
      << "no mesh to test on " << mpi_world()->size() << " ranks";
  across_ranks::buffer_collectives_match_one_process(mpi_world());
}

TEST(CollectivesMpiTest, ShardedCollectivesGiveTheBitsOfOneProcess) {
  across_ranks::sharded_collectives_match_one_process(mpi_world());
}

TEST(CollectivesMpiTest, AFailedRunStopsTheRanksThatNeedIt) {
  across_ranks::a_failed_run_stops_the_ranks_that_need_it(mpi_world());
}

}  // namespace
}  // namespace numesh::runtime
