// The transport contract (tests/runtime/transport_contract.hpp) across processes: run by CTest
// as `mpirun -np N transport_mpi_test` for N = 1, 2, 4, every rank one process on MPI's world
// (main() in mpi_main.cpp).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>

#include "numesh/runtime/transport.hpp"
#include "transport_contract.hpp"

namespace numesh::runtime {
namespace {

Transport& world() { return *mpi_world(); }

TEST(MpiTransportTest, TheWorldIsMpirunsRanks) {
  EXPECT_TRUE(has_mpi());
  EXPECT_TRUE(launched_by_mpi());
  EXPECT_EQ(world().name(), "mpi");
  EXPECT_GE(world().size(), 1);
  EXPECT_LT(world().rank(), world().size());
  EXPECT_EQ(mpi_world().get(), &world()) << "one world per process";
}
TEST(MpiTransportTest, Ring) { contract::ring(world()); }
TEST(MpiTransportTest, TagsAndOrder) { contract::tags_and_order(world()); }
TEST(MpiTransportTest, AllGather) { contract::all_gather(world()); }
TEST(MpiTransportTest, RefusesBadArguments) { contract::refuses_bad_arguments(world()); }
TEST(MpiTransportTest, SizeMismatch) { contract::size_mismatch(world()); }
TEST(MpiTransportTest, RankSettings) { contract::rank_settings(world()); }

}  // namespace
}  // namespace numesh::runtime
