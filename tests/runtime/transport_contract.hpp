#pragma once

// What every Transport must do (numesh/runtime/transport.hpp), written once and run by each
// rank: by threads over make_thread_transports(1, 2, 4) in runtime_test, and by processes over
// mpi_world() under mpirun -np 1, 2, 4 in transport_mpi_test. Each function is called on every
// rank at once and checks what its rank sees.

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "numesh/core/error.hpp"
#include "numesh/runtime/rank_settings.hpp"
#include "numesh/runtime/transport.hpp"

namespace numesh::runtime::contract {

// Bytes that depend on (rank, tag, index), so a transfer from the wrong rank, under the wrong
// tag or shifted, is seen.
inline std::vector<std::byte> pattern(int rank, int tag, std::size_t n) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = static_cast<std::byte>(
        (static_cast<std::size_t>(rank) * 131 + static_cast<std::size_t>(tag) * 17 + i * 7 + 1) %
        251);
  }
  return v;
}

// The error a transfer completed with (nullptr: success), waiting for it. The callback owns the
// promise, which may still be returning from set_value when wait() returns.
struct Outcome {
  std::future<std::exception_ptr> future;
  TransferDone callback() {
    auto promise = std::make_shared<std::promise<std::exception_ptr>>();
    future = promise->get_future();
    return [promise](std::exception_ptr e) { promise->set_value(std::move(e)); };
  }
  std::exception_ptr wait() { return future.get(); }
};

inline std::string message_of(const std::exception_ptr& error) {
  if (!error) return "(no error)";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  }
}

// Each rank sends 100003 bytes to the next rank and receives from the previous one.
inline void ring(Transport& t) {
  if (t.size() == 1) return;
  const int next = (t.rank() + 1) % t.size(), prev = (t.rank() + t.size() - 1) % t.size();
  const auto mine = pattern(t.rank(), 3, 100003);
  std::vector<std::byte> got(mine.size());
  Outcome sent, received;
  t.send(next, 3, mine, sent.callback());
  t.recv(prev, 3, got, received.callback());
  EXPECT_EQ(sent.wait(), nullptr);
  EXPECT_EQ(received.wait(), nullptr);
  EXPECT_EQ(got, pattern(prev, 3, mine.size())) << "rank " << t.rank() << " from " << prev;
}

// Rank 0 sends tag 1, tag 2, tag 1 to every other rank, which receives tag 2 first: tags keep
// transfers apart, and one tag's transfers arrive in the order sent.
inline void tags_and_order(Transport& t) {
  if (t.rank() == 0) {
    for (int peer = 1; peer < t.size(); ++peer) {
      const auto a = pattern(0, 1, 64), b = pattern(0, 2, 64), c = pattern(0, 11, 64);
      send_blocking(t, peer, 1, a);
      send_blocking(t, peer, 2, b);
      send_blocking(t, peer, 1, c);
    }
    return;
  }
  std::vector<std::byte> first(64), second(64), third(64);
  Outcome o1, o2, o3;
  t.recv(0, 2, first, o1.callback());
  t.recv(0, 1, second, o2.callback());
  t.recv(0, 1, third, o3.callback());
  EXPECT_EQ(o1.wait(), nullptr);
  EXPECT_EQ(o2.wait(), nullptr);
  EXPECT_EQ(o3.wait(), nullptr);
  EXPECT_EQ(first, pattern(0, 2, 64));
  EXPECT_EQ(second, pattern(0, 1, 64));
  EXPECT_EQ(third, pattern(0, 11, 64));
}

// Every rank's bytes in rank order; twice, then a zero-size gather and barriers.
inline void all_gather(Transport& t) {
  const auto n = static_cast<std::size_t>(t.size());
  for (int round = 0; round < 2; ++round) {
    const auto mine = pattern(t.rank(), round, 40);
    std::vector<std::byte> all(n * 40);
    t.all_gather(mine, all);
    for (std::size_t r = 0; r < n; ++r) {
      EXPECT_EQ(std::vector<std::byte>(all.begin() + static_cast<std::ptrdiff_t>(r * 40),
                                       all.begin() + static_cast<std::ptrdiff_t>((r + 1) * 40)),
                pattern(static_cast<int>(r), round, 40))
          << "rank " << t.rank() << " round " << round << ": part " << r;
    }
  }
  std::vector<std::byte> none;
  t.all_gather({}, none);
  for (int i = 0; i < 3; ++i) t.barrier();
  std::vector<std::byte> wrong(n * 40 + 1);
  EXPECT_THAT([&] { t.all_gather(pattern(t.rank(), 0, 40), wrong); },
              ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr(
                  "all_gather: " + std::to_string(n * 40) + " bytes to gather from " +
                  std::to_string(n) + " ranks of 40 bytes each need")));
}

// Bad peers and tags are refused before anything is sent, naming them.
inline void refuses_bad_arguments(Transport& t) {
  using ::testing::ThrowsMessage;
  const std::vector<std::byte> bytes(8);
  std::vector<std::byte> into(8);
  const auto ignore = [](std::exception_ptr) {};
  const int last = t.size() - 1;
  EXPECT_THAT([&] { t.send(t.size(), 0, bytes, ignore); },
              ThrowsMessage<ValueError>("send to rank " + std::to_string(t.size()) +
                                        ": no such rank (ranks 0-" + std::to_string(last) + ")"));
  EXPECT_THAT([&] { t.recv(-1, 0, into, ignore); },
              ThrowsMessage<ValueError>("recv from rank -1: no such rank (ranks 0-" +
                                        std::to_string(last) + ")"));
  EXPECT_THAT([&] { t.send(t.rank(), 0, bytes, ignore); },
              ThrowsMessage<ValueError>("send to rank " + std::to_string(t.rank()) +
                                        ": that is this rank"));
  if (t.size() > 1) {
    const int peer = (t.rank() + 1) % t.size();
    EXPECT_THAT([&] { t.send(peer, -2, bytes, ignore); },
                ThrowsMessage<ValueError>("send to rank " + std::to_string(peer) +
                                          ": tag -2 is outside [0, 16384)"));
    EXPECT_THAT([&] { t.recv(peer, kTransportTagLimit, into, ignore); },
                ThrowsMessage<ValueError>("recv from rank " + std::to_string(peer) +
                                          ": tag 16384 is outside [0, 16384)"));
    EXPECT_THAT([&] { t.send(peer, 0, bytes, TransferDone{}); },
                ThrowsMessage<ValueError>("send to rank " + std::to_string(peer) +
                                          ": no completion callback"));
  }
  t.barrier();  // nothing was sent: the ranks still agree
}

// A transfer of another size than the receiver expects fails the receive, naming both sizes;
// the send completes.
inline void size_mismatch(Transport& t) {
  if (t.size() == 1) return;
  if (t.rank() == 0) {
    send_blocking(t, 1, 5, pattern(0, 5, 8));
    send_blocking(t, 1, 6, pattern(0, 6, 32));
  } else if (t.rank() == 1) {
    std::vector<std::byte> small_into(16), big_into(16);
    Outcome smaller, larger;
    t.recv(0, 5, small_into, smaller.callback());
    EXPECT_EQ(message_of(smaller.wait()),
              "recv from rank 0, tag 5: 8 bytes arrived where 16 were expected");
    t.recv(0, 6, big_into, larger.callback());
    EXPECT_EQ(message_of(larger.wait()),
              "recv from rank 0, tag 6: the transfer is larger than the 16 bytes expected");
  }
  t.barrier();
}

// A send_run_stopped takes its transfer's place under the tag: the receive it matches fails
// with CancelledError naming the rank and the tag, its bytes untouched, and the transfers
// before and after it arrive whole. A receive of no bytes cannot tell it from a transfer.
inline void run_stopped(Transport& t) {
  if (t.size() == 1) return;
  const int tag = 7;
  if (t.rank() == 0) {
    send_blocking(t, 1, tag, pattern(0, 1, 48));
    Outcome stopped;
    t.send_run_stopped(1, tag, stopped.callback());
    EXPECT_EQ(stopped.wait(), nullptr);
    send_blocking(t, 1, tag, pattern(0, 3, 48));
    t.send_run_stopped(1, tag + 1, stopped.callback());
    EXPECT_EQ(stopped.wait(), nullptr);
  } else if (t.rank() == 1) {
    std::vector<std::byte> first(48), second(48, std::byte{5}), third(48);
    Outcome o1, o2, o3;
    t.recv(0, tag, first, o1.callback());
    t.recv(0, tag, second, o2.callback());
    t.recv(0, tag, third, o3.callback());
    EXPECT_EQ(o1.wait(), nullptr);
    EXPECT_THAT([&] { std::rethrow_exception(o2.wait()); },
                ::testing::ThrowsMessage<PeerStoppedError>(
                    "recv from rank 0, tag 7: rank 0's run stopped before these bytes were ready "
                    "(a node failed there or on a rank it waited for, or its run was cancelled)"));
    EXPECT_EQ(o3.wait(), nullptr);
    EXPECT_EQ(first, pattern(0, 1, 48));
    EXPECT_EQ(second, std::vector<std::byte>(48, std::byte{5})) << "left as they were";
    EXPECT_EQ(third, pattern(0, 3, 48));
    Outcome empty;
    t.recv(0, tag + 1, {}, empty.callback());
    EXPECT_EQ(empty.wait(), nullptr);
  }
  const auto ignore = [](std::exception_ptr) {};
  EXPECT_THAT([&] { t.send_run_stopped(t.rank(), 0, ignore); },
              ::testing::ThrowsMessage<ValueError>("send to rank " + std::to_string(t.rank()) +
                                                   ": that is this rank"));
  t.barrier();
}

// Ranks given the same settings pass; rank 1 given other dims and the last rank no dtype are
// refused on every rank with one message naming both settings and every rank's value.
inline void rank_settings(Transport& t) {
  const std::vector<RankSetting> shared{
      {"--model", "/models/m"}, {"--dims", "1,1,2"}, {"--dtype", "bf16"}};
  check_same_on_every_rank(t, shared);
  if (t.size() < 3) return;
  std::vector<RankSetting> mine = shared;
  if (t.rank() == 1) mine[1].second = "1,1,4";
  if (t.rank() == t.size() - 1) mine.pop_back();
  std::string expected = "the ranks were started with different settings: --dims:";
  for (int r = 0; r < t.size(); ++r) {
    expected += fmt::format("{} rank {} '{}'", r == 0 ? "" : ",", r, r == 1 ? "1,1,4" : "1,1,2");
  }
  expected += "; --dtype:";
  for (int r = 0; r < t.size(); ++r) {
    expected += r == t.size() - 1 ? fmt::format(", rank {} (not given)", r)
                                  : fmt::format("{} rank {} 'bf16'", r == 0 ? "" : ",", r);
  }
  EXPECT_THAT([&] { check_same_on_every_rank(t, mine); },
              ::testing::ThrowsMessage<ValueError>(expected));
  // The same settings in another order on rank 0.
  std::vector<RankSetting> reordered = shared;
  if (t.rank() == 0) std::swap(reordered[0], reordered[2]);
  EXPECT_THAT([&] { check_same_on_every_rank(t, reordered); },
              ::testing::ThrowsMessage<ValueError>(
                  "the ranks were started with different settings: the same settings in a "
                  "different order"));
}

}  // namespace numesh::runtime::contract
