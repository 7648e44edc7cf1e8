// Collectives on meshes that span ranks, the ranks as threads (make_thread_transports): every
// collective over every axis subset gives the bits one process gives on the same mesh
// (collectives_across_ranks.hpp). The same checks run across processes under mpirun in
// tests/runtime_mpi/collectives_mpi_test.cpp.

#include <gtest/gtest.h>

#include <string>

#include "collectives_across_ranks.hpp"
#include "thread_ranks.hpp"

namespace numesh::runtime {
namespace {

class CollectivesAcrossRanksTest : public ::testing::TestWithParam<int> {};

TEST_P(CollectivesAcrossRanksTest, BufferCollectivesGiveTheBitsOfOneProcess) {
  testing::on_thread_ranks(GetParam(), across_ranks::buffer_collectives_match_one_process);
}

TEST_P(CollectivesAcrossRanksTest, ShardedCollectivesGiveTheBitsOfOneProcess) {
  testing::on_thread_ranks(GetParam(), across_ranks::sharded_collectives_match_one_process);
}

TEST_P(CollectivesAcrossRanksTest, AFailedRunStopsTheRanksThatNeedIt) {
  testing::on_thread_ranks(GetParam(), across_ranks::a_failed_run_stops_the_ranks_that_need_it);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesAcrossRanksTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& param) {
                           return std::to_string(param.param) + "_ranks";
                         });

}  // namespace
}  // namespace numesh::runtime
