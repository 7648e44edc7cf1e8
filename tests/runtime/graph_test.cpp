#include "numesh/runtime/graph.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>
#include <vector>

#include "numesh/core/error.hpp"
#include "test_devices.hpp"

namespace numesh::runtime {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

std::shared_ptr<DeviceSet> two_devices() { return testing::synthetic_devices(testing::nodes(2)); }

TEST(GraphTest, NodesRunAfterTheirDependenciesAcrossDevices) {
  GraphBuilder b(testing::synthetic_devices(testing::nodes(4)));
  std::mutex m;
  std::vector<int> order;
  auto record = [&](int v) {
    return [&, v] {
      const std::lock_guard lock(m);
      order.push_back(v);
    };
  };
  // A diamond over four devices: 0 -> {1, 2} -> 3, then 3 -> 4 on device 0.
  const NodeId a = b.add(0, "a", record(0));
  const NodeId x = b.add(1, "x", record(1), {a});
  const NodeId y = b.add(2, "y", record(2), {a});
  const NodeId z = b.add(3, "z", record(3), {x, y});
  b.add(0, "w", record(4), {z});
  CompiledGraph g = b.compile();
  for (int run = 0; run < 20; ++run) {
    order.clear();
    g.run();
    ASSERT_EQ(order.size(), 5u);
    EXPECT_EQ(order.front(), 0);
    EXPECT_EQ(order[3], 3);
    EXPECT_EQ(order[4], 4);
  }
}

TEST(GraphTest, ALongChainOnTwoDevicesRunsInOrderEveryTime) {
  GraphBuilder b(two_devices());
  std::vector<int> seen;
  NodeId prev = 0;
  for (int i = 0; i < 200; ++i) {
    std::vector<NodeId> deps;
    if (i > 0) deps.push_back(prev);
    prev = b.add(
        i % 2, "n" + std::to_string(i), [&seen, i] { seen.push_back(i); }, deps);
  }
  CompiledGraph g = b.compile();
  for (int run = 0; run < 5; ++run) {
    seen.clear();
    g.run();
    ASSERT_EQ(seen.size(), 200u);
    for (int i = 0; i < 200; ++i) EXPECT_EQ(seen[static_cast<std::size_t>(i)], i);
  }
}

TEST(GraphTest, EachNodeRunsInItsDevicesArena) {
  // Two devices whose arenas differ in size (1 and 3 threads), so a node can tell which arena
  // it runs in.
  PlacementOptions options;
  options.policy = PlacementPolicy::kExplicit;
  options.explicit_cpusets = {CpuSet::parse("0"), CpuSet::parse("1-3")};
  auto devices = DeviceSet::create(Topology::from_synthetic("numa:1 core:4 pu:1"), options);
  ASSERT_EQ(devices->device(0).arena().max_concurrency(), 1);
  ASSERT_EQ(devices->device(1).arena().max_concurrency(), 3);
  GraphBuilder b(devices);
  std::atomic<int> wrong{0};
  NodeId prev = 0;
  for (int i = 0; i < 16; ++i) {
    const int d = i % 2;
    std::vector<NodeId> deps;
    if (i > 0) deps.push_back(prev);
    prev = b.add(
        d, "n",
        [&, d] {
          if (oneapi::tbb::this_task_arena::max_concurrency() != (d == 0 ? 1 : 3)) ++wrong;
        },
        deps);
  }
  CompiledGraph g = b.compile();
  g.run();
  g.run();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(GraphTest, AnExceptionReachesTheCallerAndTheGraphRunsAgain) {
  GraphBuilder b(two_devices());
  std::atomic<bool> fail{true};
  std::atomic<int> after{0};
  const NodeId a = b.add(0, "ok", [] {});
  const NodeId bad = b.add(1, "bad",
                           [&] {
                             if (fail) throw std::runtime_error("shard 3 is broken");
                           },
                           {a});
  b.add(0, "after", [&] { ++after; }, {bad});
  CompiledGraph g = b.compile();
  EXPECT_THAT([&] { g.run(); }, ThrowsMessage<std::runtime_error>(HasSubstr("shard 3 is broken")));
  EXPECT_EQ(g.failed_node(), "bad");
  EXPECT_EQ(after.load(), 0) << "a node after the failure must be skipped";
  fail = false;
  g.run();
  EXPECT_EQ(after.load(), 1);
  EXPECT_EQ(g.failed_node(), "");
}

TEST(GraphTest, NumeshErrorsKeepTheirType) {
  GraphBuilder b(two_devices());
  b.add(1, "shape", [] { throw ShapeError("dim 0 of size 7 is not divisible by 2"); });
  CompiledGraph g = b.compile();
  EXPECT_THAT([&] { g.run(); }, ThrowsMessage<ShapeError>(HasSubstr("not divisible by 2")));
}

TEST(GraphTest, CancelFromANodeSkipsTheRestAndThrowsCancelled) {
  GraphBuilder b(two_devices());
  CompiledGraph* self = nullptr;
  std::atomic<int> ran{0};
  const NodeId first = b.add(0, "first", [&] {
    ++ran;
    self->cancel();
  });
  const NodeId second = b.add(1, "second", [&] { ++ran; }, {first});
  b.add(0, "third", [&] { ++ran; }, {second});
  CompiledGraph g = b.compile();
  self = &g;
  EXPECT_THAT([&] { g.run(); }, ThrowsMessage<CancelledError>(HasSubstr("cancelled")));
  EXPECT_EQ(ran.load(), 1);
  self = nullptr;
  // A later run is not cancelled.
  GraphBuilder b2(two_devices());
  b2.add(0, "x", [&] { ++ran; });
  CompiledGraph g2 = b2.compile();
  g2.cancel();  // nothing running: no effect
  g2.run();
  EXPECT_EQ(ran.load(), 2);
}

TEST(GraphTest, ACancelAfterEveryNodeRanCancelsNothing) {
  GraphBuilder b(two_devices());
  CompiledGraph* self = nullptr;
  int ran = 0;
  b.add(1, "only", [&] {
    ++ran;
    self->cancel();  // the run's last node: nothing is left to skip
  });
  CompiledGraph g = b.compile();
  self = &g;
  g.run();
  EXPECT_EQ(ran, 1);
}

TEST(GraphTest, AnEmptyGraphRuns) {
  GraphBuilder b(two_devices());
  CompiledGraph g = b.compile();
  EXPECT_EQ(g.size(), 0u);
  g.run();
}

TEST(GraphTest, BadNodesAreRejectedWithTheirNames) {
  GraphBuilder b(two_devices());
  EXPECT_THAT(
      [&] { b.add(5, "far", [] {}); },
      ThrowsMessage<IndexError>(HasSubstr("node 'far': device 5 does not exist (2 devices)")));
  EXPECT_THAT([&] { b.add(0, "dangling", [] {}, {3}); },
              ThrowsMessage<IndexError>(HasSubstr("node 'dangling' depends on node 3")));
  EXPECT_THAT([&] { b.add(0, "empty", std::function<void()>()); },
              ThrowsMessage<ValueError>(HasSubstr("node 'empty' has no body")));
  const NodeId a = b.add(0, "a", [] {});
  const NodeId c = b.add(1, "c", [] {});
  EXPECT_THAT([&] { b.depend(c, a); }, ThrowsMessage<ValueError>(HasSubstr("goes backwards")));
  EXPECT_THAT([&] { b.depend(a, 9); }, ThrowsMessage<IndexError>(HasSubstr("edge 0 -> 9")));
  EXPECT_THAT([] { GraphBuilder(nullptr); },
              ThrowsMessage<ValueError>(HasSubstr("needs a device set")));
}

TEST(GraphTest, DependAddsAnEdge) {
  GraphBuilder b(two_devices());
  std::vector<int> order;
  const NodeId a = b.add(1, "a", [&] { order.push_back(1); });
  const NodeId c = b.add(0, "c", [&] { order.push_back(2); });
  b.depend(a, c);
  EXPECT_EQ(b.node(c).deps, std::vector<NodeId>{a});
  CompiledGraph g = b.compile();
  g.run();
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

TEST(GraphTest, DotShowsDeviceClustersAndCrossDeviceEdges) {
  GraphBuilder b(two_devices());
  const NodeId a = b.add(0, "load \"x\"", [] {});
  b.add(
      1, "reduce", [] {}, {a}, NodeKind::kCollective, 64);
  const std::string dot = b.compile().to_dot();
  EXPECT_THAT(dot, HasSubstr("subgraph cluster_device0"));
  EXPECT_THAT(dot, HasSubstr("subgraph cluster_device1"));
  EXPECT_THAT(dot, HasSubstr("n0 [label=\"load \\\"x\\\"\", shape=ellipse]"));
  EXPECT_THAT(dot, HasSubstr("n1 [label=\"reduce\", shape=box]"));
  EXPECT_THAT(dot, HasSubstr("n0 -> n1 [style=dashed]"));
}

TEST(GraphTest, TimingGivesATableAndAChromeTrace) {
  GraphBuilder b(two_devices());
  const NodeId a = b.add(0, "first", [] {});
  b.add(
      1, "second", [] {}, {a}, NodeKind::kCollective, 128);
  CompiledGraph g = b.compile();
  g.run();
  EXPECT_FALSE(g.timings()[0].ran) << "timing is off by default";
  g.set_timing(true);
  g.run();
  ASSERT_EQ(g.timings().size(), 2u);
  EXPECT_TRUE(g.timings()[0].ran);
  EXPECT_TRUE(g.timings()[1].ran);
  EXPECT_LE(g.timings()[0].start, g.timings()[0].end);
  EXPECT_LE(g.timings()[0].end, g.timings()[1].start) << "second waits for first";
  EXPECT_THAT(g.timing_table(), HasSubstr("first"));
  const auto trace = nlohmann::json::parse(g.chrome_trace());
  int complete = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X") {
      ++complete;
      if (e["name"] == "second") {
        EXPECT_EQ(e["pid"], 1);
        EXPECT_EQ(e["cat"], "collective");
        EXPECT_EQ(e["args"]["bytes"], 128);
      }
    }
  }
  EXPECT_EQ(complete, 2);
}

TEST(GraphTest, MoreDevicesThanCoresCompleteWithoutSpinning) {
  // 8 devices on whatever the machine has: each waits only on graph edges.
  auto devices = testing::synthetic_devices(testing::nodes(8));
  GraphBuilder b(devices);
  std::atomic<int> sum{0};
  std::vector<NodeId> layer;
  for (int d = 0; d < 8; ++d) layer.push_back(b.add(d, "l0", [&] { ++sum; }));
  for (int l = 1; l < 10; ++l) {
    std::vector<NodeId> next;
    for (int d = 0; d < 8; ++d)
      next.push_back(b.add(
          d, "l", [&] { ++sum; }, layer));
    layer = next;
  }
  CompiledGraph g = b.compile();
  for (int run = 0; run < 10; ++run) g.run();
  EXPECT_EQ(sum.load(), 800);
}

// A thread that completes asynchronous nodes after they started, as a transport's progress
// thread does: each start hands it a `done`, which it calls later with the error given.
class LateCompleter {
 public:
  LateCompleter()
      : thread_([this] {
          std::unique_lock lock(m_);
          for (;;) {
            cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
            if (queue_.empty()) return;
            auto [done, error] = std::move(queue_.front());
            queue_.pop_front();
            lock.unlock();
            std::this_thread::sleep_for(std::chrono::microseconds(200));
            done(error);
            lock.lock();
          }
        }) {}
  ~LateCompleter() {
    {
      const std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  LateCompleter(const LateCompleter&) = delete;
  LateCompleter& operator=(const LateCompleter&) = delete;

  /// Calls `done` with `error` 200 us later, from the completer's thread.
  void later(NodeDone done, std::exception_ptr error = nullptr) {
    {
      const std::lock_guard lock(m_);
      queue_.emplace_back(std::move(done), error);
    }
    cv_.notify_all();
  }

  /// A start that queues its done, to be called with `error`.
  AsyncStart start(std::exception_ptr error = nullptr) {
    return [this, error](NodeDone done, RunState) { later(std::move(done), error); };
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::pair<NodeDone, std::exception_ptr>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

// An asynchronous node completes when its done is called, from another thread, not when its
// start returns: its successors on its own device and on another wait for the done, and so
// does run() when the node is a sink.
TEST(GraphTest, AnAsynchronousNodeCompletesWhenItsDoneIsCalled) {
  LateCompleter completer;
  GraphBuilder b(two_devices());
  // The transfer's and the sink's dones, counted apart: the sink may complete while the
  // transfer's other successors still run.
  std::atomic<int> transfers{0}, sinks{0};
  std::vector<int> seen_by_successors;
  std::mutex m;
  auto counting = [&](std::atomic<int>& completed) {
    return [&completer, &completed](NodeDone done, RunState) {
      completer.later([&completed, done = std::move(done)](std::exception_ptr e) {
        ++completed;
        done(e);
      });
    };
  };
  const NodeId first = b.add(0, "first", [] {});
  const NodeId transfer = b.add_async(0, "transfer", counting(transfers), {first});
  for (int d = 0; d < 2; ++d) {
    b.add(d, "after" + std::to_string(d),
          [&] {
            const std::lock_guard lock(m);
            seen_by_successors.push_back(transfers.load());
          },
          {transfer});
  }
  // A successor on the transfer's device that also waits for a plain node there: it must wait
  // for both (it once ran after the plain node alone, and again after the transfer).
  const NodeId plain = b.add(0, "plain", [] {});
  b.add(0, "both",
        [&] {
          const std::lock_guard lock(m);
          seen_by_successors.push_back(transfers.load());
        },
        {plain, transfer});
  const NodeId sink = b.add_async(1, "sink", counting(sinks), {transfer});
  EXPECT_EQ(b.node(transfer).kind, NodeKind::kTransfer);
  CompiledGraph g = b.compile();
  for (int run = 1; run <= 5; ++run) {
    seen_by_successors.clear();
    g.run();
    EXPECT_EQ(sinks.load(), run) << "run() waited for the asynchronous sink";
    EXPECT_EQ(seen_by_successors, (std::vector<int>{run, run, run}))
        << "every successor ran once, after the transfer's done";
  }
  (void)sink;
}

// A transfer's end starts before the computation that is ready on its device at the same time:
// another rank may be waiting on it, and a one-thread device that ran a long reduction first
// held the peer rank idle that long. Here eight compute nodes and a transfer become ready
// together when their one predecessor ends; the transfer, added between them, starts first,
// every run.
TEST(GraphTest, ATransferStartsBeforeComputationReadyWithIt) {
  GraphBuilder b(testing::synthetic_devices(testing::nodes(1)));
  std::vector<std::string> order;  // one device thread: no lock needed
  const NodeId first = b.add(0, "first", [] {});
  const auto compute = [&](const std::string& name) {
    b.add(0, name, [&order, name] { order.push_back(name); }, {first});
  };
  for (int i = 0; i < 4; ++i) compute("compute" + std::to_string(i));
  b.add_async(0, "transfer",
              [&order](NodeDone done, RunState) {
                order.push_back("transfer");
                done(nullptr);
              },
              {first});
  for (int i = 4; i < 8; ++i) compute("compute" + std::to_string(i));
  CompiledGraph g = b.compile();
  for (int run = 0; run < 20; ++run) {
    order.clear();
    g.run();
    ASSERT_EQ(order.size(), 9u);
    EXPECT_EQ(order.front(), "transfer")
        << "run " << run << ": " << ::testing::PrintToString(order);
  }
}

// An asynchronous node that fails, by its done or by throwing from its start, or by an injected
// fault, ends the run with that error, names the node, skips what depends on it, and leaves the
// graph able to run again.
TEST(GraphTest, AnAsynchronousNodesErrorEndsTheRun) {
  LateCompleter completer;
  const auto devices = two_devices();
  bool fail_late = false, fail_early = false;
  int after = 0;
  GraphBuilder b(devices);
  RunState state = RunState::kGoing;
  const NodeId transfer = b.add_async(1, "recv[1]", [&](NodeDone done, RunState run) {
    state = run;
    if (fail_early) throw ValueError("bad peer");
    completer.later(std::move(done),
                    fail_late ? std::make_exception_ptr(IoError("peer went away")) : nullptr);
  });
  b.add(0, "consumer", [&] { ++after; }, {transfer});
  CompiledGraph g = b.compile();
  fail_late = true;
  EXPECT_THAT([&] { g.run(); }, ThrowsMessage<IoError>("peer went away"));
  EXPECT_EQ(g.failed_node(), "recv[1]");
  EXPECT_EQ(after, 0);
  fail_late = false;
  fail_early = true;
  EXPECT_THAT([&] { g.run(); }, ThrowsMessage<ValueError>("bad peer"));
  EXPECT_EQ(after, 0);
  fail_early = false;
  EXPECT_EQ(state, RunState::kGoing);
  g.inject_fault(transfer);
  EXPECT_THAT([&] { g.run(); },
              ThrowsMessage<InjectedFault>("injected fault in node recv[1] (device 1)"));
  EXPECT_EQ(after, 0);
  EXPECT_EQ(state, RunState::kStopping) << "an injected fault fails the run before the start";
  g.run();
  EXPECT_EQ(after, 1);
  EXPECT_EQ(state, RunState::kGoing);
  EXPECT_EQ(g.failed_node(), "");
}

// An asynchronous node starts even in a run that is failing or cancelled, told that the run is
// stopping: its transfer is matched by another rank's graph, and one left out would put the
// ranks' transfers out of step. A cancel that came before the transfer started ends the run
// cancelled even though no other node was left to skip: the transfer did not carry its work.
TEST(GraphTest, AnAsynchronousNodeStartsEvenInAStoppingRun) {
  LateCompleter completer;
  GraphBuilder b(two_devices());
  std::atomic<int> started{0};
  std::vector<RunState> states;  // one start at a time: the runs are one after another
  enum { kFail, kCancel, kGo } first_does = kFail;
  CompiledGraph* self = nullptr;
  const NodeId first = b.add(0, "first", [&] {
    if (first_does == kFail) throw ValueError("first failed");
    if (first_does == kCancel) self->cancel();
  });
  const NodeId send = b.add_async(1, "send",
                                  [&](NodeDone done, RunState run) {
                                    ++started;
                                    states.push_back(run);
                                    completer.later(std::move(done));
                                  },
                                  {first});
  int after = 0;
  b.add(0, "after", [&] { ++after; }, {send});  // skipped: the run stops
  CompiledGraph g = b.compile();
  self = &g;
  EXPECT_THROW(g.run(), ValueError);
  EXPECT_EQ(started.load(), 1) << "started after a failed node";
  first_does = kCancel;
  EXPECT_THROW(g.run(), CancelledError);
  EXPECT_EQ(started.load(), 2) << "started in a cancelled run";
  EXPECT_EQ(after, 0);
  first_does = kGo;
  g.run();
  EXPECT_EQ(after, 1);
  EXPECT_EQ(states,
            (std::vector<RunState>{RunState::kStopping, RunState::kStopping, RunState::kGoing}));
  // The cancel comes with the send as the run's last node: nothing is left to skip.
  GraphBuilder last(two_devices());
  const NodeId only = last.add(0, "first", [&] { self->cancel(); });
  last.add_async(1, "send",
                 [&](NodeDone done, RunState run) {
                   states.push_back(run);
                   done(nullptr);
                 },
                 {only});
  CompiledGraph h = last.compile();
  self = &h;
  EXPECT_THROW(h.run(), CancelledError);
  EXPECT_EQ(states.back(), RunState::kStopping);
}

// Timing of an asynchronous node spans start to done; traces and DOT mark it as a transfer.
TEST(GraphTest, AnAsynchronousNodeIsTimedAndDrawnAsATransfer) {
  LateCompleter completer;
  GraphBuilder b(two_devices());
  const NodeId a = b.add(0, "compute", [] {});
  b.add_async(1, "send", completer.start(), {a}, NodeKind::kTransfer, 256);
  CompiledGraph g = b.compile();
  g.set_timing(true);
  g.run();
  ASSERT_TRUE(g.timings()[1].ran);
  EXPECT_GE(g.timings()[1].end - g.timings()[1].start, 150e-6)
      << "the completer waits 200 us before calling done";
  const auto trace = nlohmann::json::parse(g.chrome_trace());
  bool found = false;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X" && e["name"] == "send") {
      found = true;
      EXPECT_EQ(e["cat"], "transfer");
      EXPECT_EQ(e["args"]["bytes"], 256);
    }
  }
  EXPECT_TRUE(found);
  EXPECT_THAT(g.to_dot(), HasSubstr("n1 [label=\"send\", shape=parallelogram]"));
  EXPECT_EQ(to_string(NodeKind::kTransfer), "transfer");
  EXPECT_THAT([&] { GraphBuilder(two_devices()).add_async(0, "x", nullptr); },
              ThrowsMessage<ValueError>("node 'x' has no start"));
}

}  // namespace
}  // namespace numesh::runtime
