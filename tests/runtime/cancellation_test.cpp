#include "numesh/runtime/cancellation.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "numesh/core/error.hpp"
#include "numesh/runtime/graph.hpp"
#include "test_devices.hpp"

namespace numesh::runtime {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// A chain of `n` nodes alternating between the two devices, each counting itself in `ran` and
// first calling `before(i)`.
template <class Before>
CompiledGraph counting_chain(int n, std::atomic<int>& ran, Before before) {
  GraphBuilder b(testing::synthetic_devices(testing::nodes(2)));
  NodeId prev = 0;
  for (int i = 0; i < n; ++i) {
    std::vector<NodeId> deps;
    if (i > 0) deps.push_back(prev);
    prev = b.add(
        i % 2, "n" + std::to_string(i),
        [&ran, before, i] {
          before(i);
          ++ran;
        },
        deps);
  }
  return b.compile();
}

TEST(CancellationTest, ACancelFromANodeStopsTheRunAndEveryLaterRunUnderTheSource) {
  CancelSource source;
  std::atomic<int> ran{0};
  CompiledGraph g = counting_chain(4, ran, [&](int i) {
    if (i == 1) source.cancel();
  });
  const CancelScope scope(source);
  EXPECT_THAT([&] { g.run(); }, ThrowsMessage<CancelledError>(HasSubstr("cancelled")));
  EXPECT_EQ(ran.load(), 2);  // nodes 0 and 1; 2 and 3 skipped
  EXPECT_TRUE(source.cancelled());
  // Every later run under the source stops before its first node.
  EXPECT_THAT([&] { g.run(); },
              ThrowsMessage<CancelledError>(HasSubstr("cancelled by the caller before it began")));
  EXPECT_EQ(ran.load(), 2);
  EXPECT_EQ(source.runs_begun(), 2);
}

TEST(CancellationTest, ACancelFromAnotherThreadStopsTheRunningGraphWhereItIs) {
  CancelSource source;
  std::atomic<int> ran{0};
  // Node 0 says it started and waits until the other thread has cancelled: the cancel lands
  // mid-run.
  std::atomic<bool> started{false};
  CompiledGraph g = counting_chain(6, ran, [&](int i) {
    if (i != 0) return;
    started = true;
    while (!source.cancelled()) std::this_thread::yield();
  });
  std::thread canceller([&] {
    while (!started) std::this_thread::yield();
    source.cancel();
  });
  {
    const CancelScope scope(source);
    EXPECT_THROW(g.run(), CancelledError);
  }
  canceller.join();
  EXPECT_EQ(ran.load(), 1);
  // Outside the scope the graph answers to no source: it runs whole.
  g.run();
  EXPECT_EQ(ran.load(), 7);
}

TEST(CancellationTest, ACallOfSeveralGraphsStopsAtTheOneRunningAndRunsNoneAfter) {
  // As a model call runs its embedding, stack and head: a cancel during the second leaves the
  // third unbegun.
  CancelSource source;
  std::atomic<int> ran{0};
  CompiledGraph first = counting_chain(2, ran, [](int) {});
  CompiledGraph second = counting_chain(3, ran, [&](int i) {
    if (i == 0) source.cancel();
  });
  CompiledGraph third = counting_chain(2, ran, [](int) {});
  const CancelScope scope(source);
  const auto call = [&] {
    first.run();
    second.run();
    third.run();
  };
  EXPECT_THROW(call(), CancelledError);
  EXPECT_EQ(ran.load(), 3);  // the first whole, the second's node 0
  EXPECT_EQ(source.runs_begun(), 2);
}

TEST(CancellationTest, AShieldLetsWorkThatMustBeWholeComplete) {
  CancelSource source;
  std::atomic<int> ran{0};
  CompiledGraph g = counting_chain(3, ran, [&](int i) {
    if (i == 0) source.cancel();
  });
  const CancelScope scope(source);
  {
    const CancelShield shield;
    EXPECT_EQ(CancelScope::current(), nullptr);
    g.run();  // cancelled by its own node, yet shielded: it completes
    g.run();
    EXPECT_EQ(ran.load(), 6);
  }
  EXPECT_EQ(CancelScope::current(), &source);
  EXPECT_THROW(g.run(), CancelledError);
  EXPECT_EQ(ran.load(), 6);
}

TEST(CancellationTest, ScopesNestAndBelongToTheirThread) {
  CancelSource outer, inner;
  std::atomic<int> ran{0};
  CompiledGraph g = counting_chain(2, ran, [](int) {});
  EXPECT_EQ(CancelScope::current(), nullptr);
  const CancelScope a(outer);
  {
    const CancelScope b(inner);
    EXPECT_EQ(CancelScope::current(), &inner);
    outer.cancel();  // not the innermost: no effect on this run
    g.run();
    EXPECT_EQ(ran.load(), 2);
    // Another thread has no scope: the source does not reach its runs.
    inner.cancel();
    std::thread other([&] {
      EXPECT_EQ(CancelScope::current(), nullptr);
      g.run();
    });
    other.join();
    EXPECT_EQ(ran.load(), 4);
    EXPECT_THROW(g.run(), CancelledError);
  }
  EXPECT_EQ(CancelScope::current(), &outer);
  EXPECT_THROW(g.run(), CancelledError);
  EXPECT_EQ(ran.load(), 4);
}

TEST(CancellationTest, NoCancelIsLostToARaceWithARunsStart) {
  // One thread runs a short graph again and again under the source; another cancels at a
  // varying moment. After cancel() returns, at most the run then finishing its last node
  // completes: the next one always throws.
  for (int round = 0; round < 200; ++round) {
    CancelSource source;
    std::atomic<int> ran{0};
    CompiledGraph g = counting_chain(2, ran, [](int) {});
    std::atomic<long> completed{0};
    std::thread runner([&] {
      const CancelScope scope(source);
      try {
        for (;;) {
          g.run();
          completed.fetch_add(1, std::memory_order_acq_rel);
        }
      } catch (const CancelledError&) {
      }
    });
    while (source.runs_begun() < 1 + round % 7) std::this_thread::yield();
    source.cancel();
    const long at_cancel = completed.load(std::memory_order_acquire);
    runner.join();
    ASSERT_LE(completed.load(), at_cancel + 1) << "round " << round;
  }
}

}  // namespace
}  // namespace numesh::runtime
