// The transport seam (numesh/runtime/transport.hpp) in one process: the contract of every
// transport (transport_contract.hpp) over 1, 2 and 4 ranks run as threads, and what the
// single-process transport and a build's MPI entry points do. The same contract runs across
// processes under mpirun in tests/runtime_mpi.

#include "numesh/runtime/transport.hpp"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "numesh/core/error.hpp"
#include "thread_ranks.hpp"
#include "transport_contract.hpp"

namespace numesh::runtime {
namespace {

using ::testing::ThrowsMessage;

// Runs `body` on every endpoint of `ranks` thread transports at once.
void on_thread_ranks(int ranks, const std::function<void(Transport&)>& body) {
  testing::on_thread_ranks(ranks, [&](const std::shared_ptr<Transport>& t) { body(*t); });
}

class ThreadTransportTest : public ::testing::TestWithParam<int> {};

TEST_P(ThreadTransportTest, EndpointsAreTheRanks) {
  auto endpoints = make_thread_transports(GetParam());
  for (int r = 0; r < GetParam(); ++r) {
    EXPECT_EQ(endpoints[static_cast<std::size_t>(r)]->rank(), r);
    EXPECT_EQ(endpoints[static_cast<std::size_t>(r)]->size(), GetParam());
    EXPECT_EQ(endpoints[static_cast<std::size_t>(r)]->name(), "threads");
  }
}
TEST_P(ThreadTransportTest, Ring) { on_thread_ranks(GetParam(), contract::ring); }
TEST_P(ThreadTransportTest, TagsAndOrder) { on_thread_ranks(GetParam(), contract::tags_and_order); }
TEST_P(ThreadTransportTest, AllGather) { on_thread_ranks(GetParam(), contract::all_gather); }
TEST_P(ThreadTransportTest, RefusesBadArguments) {
  on_thread_ranks(GetParam(), contract::refuses_bad_arguments);
}
TEST_P(ThreadTransportTest, SizeMismatch) { on_thread_ranks(GetParam(), contract::size_mismatch); }
TEST_P(ThreadTransportTest, RunStopped) { on_thread_ranks(GetParam(), contract::run_stopped); }
TEST_P(ThreadTransportTest, RankSettings) { on_thread_ranks(GetParam(), contract::rank_settings); }

INSTANTIATE_TEST_SUITE_P(Ranks, ThreadTransportTest, ::testing::Values(1, 2, 4),
                         [](const ::testing::TestParamInfo<int>& param) {
                           return std::to_string(param.param) + "_ranks";
                         });

TEST(ThreadTransportTest, RefusesNoRanks) {
  EXPECT_THAT([] { make_thread_transports(0); },
              ThrowsMessage<ValueError>("make_thread_transports: 0 ranks (1 or more)"));
}

// A receive posted before its send, and a send before its receive, both complete (the matching
// is symmetric); the callbacks run on the thread that matched.
TEST(ThreadTransportTest, MatchesWhicheverSideComesFirst) {
  auto t = make_thread_transports(2);
  const auto bytes = contract::pattern(0, 9, 100);
  std::vector<std::byte> into(100);
  contract::Outcome received, sent;
  t[1]->recv(0, 9, into, received.callback());
  t[0]->send(1, 9, bytes, sent.callback());
  EXPECT_EQ(sent.wait(), nullptr);
  EXPECT_EQ(received.wait(), nullptr);
  EXPECT_EQ(into, bytes);
  contract::Outcome sent2, received2;
  std::vector<std::byte> into2(100);
  t[0]->send(1, 9, bytes, sent2.callback());
  t[1]->recv(0, 9, into2, received2.callback());
  EXPECT_EQ(sent2.wait(), nullptr);
  EXPECT_EQ(received2.wait(), nullptr);
  EXPECT_EQ(into2, bytes);
}

TEST(SingleProcessTransportTest, IsRankZeroOfOneAndHasNoPeers) {
  SingleProcessTransport t;
  EXPECT_EQ(t.rank(), 0);
  EXPECT_EQ(t.size(), 1);
  EXPECT_EQ(t.name(), "single process");
  contract::all_gather(t);
  contract::refuses_bad_arguments(t);
}

TEST(MpiEntryPointsTest, SayWhetherTheBuildHasMpi) {
#ifdef NUMESH_TEST_WITH_MPI
  EXPECT_TRUE(has_mpi());
#else
  EXPECT_FALSE(has_mpi());
  EXPECT_THAT([] { mpi_world(); },
              ThrowsMessage<NotImplementedError>(::testing::HasSubstr(
                  "this numesh was built without MPI (configure with -DNUMESH_WITH_MPI=ON")));
#endif
}

TEST(MpiEntryPointsTest, LaunchedByMpiReadsTheLaunchersVariables) {
  // The test itself may run under mpirun; only the variables' effect is checked.
  const char* names[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"};
  std::vector<std::string> saved;
  for (const char* name : names) {
    const char* v = std::getenv(name);
    saved.push_back(v != nullptr ? v : "\x01");
    unsetenv(name);
  }
  EXPECT_FALSE(launched_by_mpi());
  EXPECT_EQ(launched_ranks(), 0);
  setenv("PMIX_RANK", "1", 1);
  EXPECT_TRUE(launched_by_mpi());
  EXPECT_EQ(launched_ranks(), 0) << "PMIx alone does not say the world's size";
  unsetenv("PMIX_RANK");
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  EXPECT_EQ(launched_ranks(), 4);
  setenv("OMPI_COMM_WORLD_SIZE", "x", 1);
  EXPECT_EQ(launched_ranks(), 0) << "a size that is not a number is no size";
  unsetenv("OMPI_COMM_WORLD_SIZE");
  setenv("PMI_SIZE", "2", 1);
  EXPECT_EQ(launched_ranks(), 2);
  unsetenv("PMI_SIZE");
  for (std::size_t i = 0; i < saved.size(); ++i) {
    if (saved[i] != "\x01") setenv(names[i], saved[i].c_str(), 1);
  }
}

// NUMESH_RANK_TIMEOUT: seconds (fractions allowed, 0 for no limit), the default when unset or
// empty, anything else refused naming the variable and its value. A transport's patience is
// set and read back; a negative one is refused.
TEST(PatienceTest, ComesFromNumeshRankTimeout) {
  const char* v = std::getenv("NUMESH_RANK_TIMEOUT");
  const std::string saved = v != nullptr ? v : "\x01";
  unsetenv("NUMESH_RANK_TIMEOUT");
  EXPECT_EQ(patience_from_environment(), kDefaultPatience);
  EXPECT_EQ(kDefaultPatience, std::chrono::seconds(600));
  setenv("NUMESH_RANK_TIMEOUT", "", 1);
  EXPECT_EQ(patience_from_environment(), kDefaultPatience);
  setenv("NUMESH_RANK_TIMEOUT", "2.5", 1);
  EXPECT_EQ(patience_from_environment(), std::chrono::milliseconds(2500));
  setenv("NUMESH_RANK_TIMEOUT", "0", 1);
  EXPECT_EQ(patience_from_environment(), std::chrono::milliseconds(0));
  for (const char* bad : {"abc", "-1", "3s", "1e99"}) {
    setenv("NUMESH_RANK_TIMEOUT", bad, 1);
    EXPECT_THAT(
        [] { (void)patience_from_environment(); },
        ThrowsMessage<ValueError>(fmt::format(
            "NUMESH_RANK_TIMEOUT='{}' is not a number of seconds (0 or more; 0: no limit)", bad)));
  }
  if (saved != "\x01") {
    setenv("NUMESH_RANK_TIMEOUT", saved.c_str(), 1);
  } else {
    unsetenv("NUMESH_RANK_TIMEOUT");
  }
  SingleProcessTransport t;
  EXPECT_EQ(t.patience(), kDefaultPatience);
  t.set_patience(std::chrono::milliseconds(40));
  EXPECT_EQ(t.patience(), std::chrono::milliseconds(40));
  EXPECT_THAT([&] { t.set_patience(std::chrono::milliseconds(-1)); },
              ThrowsMessage<ValueError>("set_patience: -1 ms is negative"));
}

}  // namespace
}  // namespace numesh::runtime
