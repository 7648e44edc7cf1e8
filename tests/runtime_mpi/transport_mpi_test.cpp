// The transport contract (tests/runtime/transport_contract.hpp) across processes: run by CTest
// as `mpirun -np N transport_mpi_test` for N = 1, 2, 4, every rank one process on MPI's world
// (main() in mpi_main.cpp).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <thread>

#include "numesh/core/error.hpp"
#include "numesh/runtime/transport.hpp"
#include "transport_contract.hpp"

namespace numesh::runtime {
namespace {

using ::testing::ThrowsMessage;

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
TEST(MpiTransportTest, RunStopped) { contract::run_stopped(world()); }
TEST(MpiTransportTest, RankSettings) { contract::rank_settings(world()); }

// The watchdog: a bounded receive that nothing matches fails with TimeoutError naming the
// silent rank once the patience has passed; an unbounded one waits past it for what comes late.
// On one rank there is no peer to wait for: the world starts with NUMESH_RANK_TIMEOUT's patience
// (600 s, unset in the tests).
TEST(MpiTransportTest, ASilentRankTimesOutNamingIt) {
  Transport& t = world();
  EXPECT_EQ(t.patience(), patience_from_environment());
  if (t.size() == 1) return;
  const std::chrono::milliseconds patience = t.patience();
  constexpr int kTag = 77;
  std::int32_t value = 0;
  auto bytes = std::as_writable_bytes(std::span(&value, 1));
  if (t.rank() == 0) {
    t.set_patience(std::chrono::milliseconds(300));  // the other ranks wait as long as it takes
    const auto start = std::chrono::steady_clock::now();
    EXPECT_THAT([&] { recv_blocking(t, 1, kTag, bytes); },
                ThrowsMessage<TimeoutError>(
                    "recv from rank 1, tag 77: nothing from rank 1 for 0.3 s; it has most likely "
                    "hung (NUMESH_RANK_TIMEOUT sets how long ranks wait for each other)"));
    EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(300));
    t.set_patience(patience);
  }
  t.barrier();  // rank 0 has given up: rank 1 now sends, late, for an unbounded receive
  if (t.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    const std::int32_t late = 42;
    send_blocking(t, 0, kTag, std::as_bytes(std::span(&late, 1)));
  } else if (t.rank() == 0) {
    recv_blocking(t, 1, kTag, bytes, Patience::kUnbounded);
    EXPECT_EQ(value, 42) << "the timed-out receive took nothing; the unbounded one waited";
  }
  t.barrier();
}

}  // namespace
}  // namespace numesh::runtime
