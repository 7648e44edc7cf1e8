#include "numesh/runtime/graph.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
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

}  // namespace
}  // namespace numesh::runtime
