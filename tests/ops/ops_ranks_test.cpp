// Programs on meshes split over ranks, the ranks threads of this process (make_thread_transports):
// the transformer stack and a training step give one process's bits (across_ranks.hpp; the same
// checks run as processes under mpirun in ops_mpi_test).

#include <gtest/gtest.h>

#include "../runtime/thread_ranks.hpp"
#include "across_ranks.hpp"

namespace numesh::ops {
namespace {

class OpsAcrossRanksTest : public ::testing::TestWithParam<int> {};

TEST_P(OpsAcrossRanksTest, TheTransformerStackGivesTheBitsOfOneProcess) {
  runtime::testing::on_thread_ranks(GetParam(), across_ranks::transformer_matches_one_process);
}

TEST_P(OpsAcrossRanksTest, ATrainingStepGivesTheBitsOfOneProcess) {
  runtime::testing::on_thread_ranks(GetParam(), across_ranks::training_step_matches_one_process);
}

INSTANTIATE_TEST_SUITE_P(Ranks, OpsAcrossRanksTest, ::testing::Values(1, 2, 4),
                         [](const ::testing::TestParamInfo<int>& param) {
                           return std::to_string(param.param) + "_ranks";
                         });

}  // namespace
}  // namespace numesh::ops
