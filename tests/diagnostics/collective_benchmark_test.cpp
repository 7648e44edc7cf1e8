// The collective benchmark cases that `numesh bench collectives` and bench/collectives_bench.cpp
// time (numesh/diagnostics/collective_benchmark.hpp), and the timing loop (numesh/core/timing.hpp):
// every case must compute the right result on synthetic devices, since a figure of a wrong
// collective means nothing.

#include "numesh/diagnostics/collective_benchmark.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "numesh/core/error.hpp"
#include "numesh/core/timing.hpp"
#include "numesh/runtime/topology.hpp"

namespace numesh::diagnostics {

using namespace numesh::runtime;
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

std::shared_ptr<DeviceSet> synthetic_devices(const std::string& description) {
  return DeviceSet::create(Topology::from_synthetic(description), PlacementOptions{});
}

TEST(CollectiveOpTest, NamesRoundTrip) {
  for (CollectiveOp op : all_collective_ops()) EXPECT_EQ(parse_collective_op(to_string(op)), op);
  EXPECT_EQ(all_collective_ops().size(), 4u);
  EXPECT_THAT(
      [] { parse_collective_op("all-sum"); },
      ThrowsMessage<ValueError>("unknown collective 'all-sum' (choose all-reduce, all-gather, "
                                "reduce-scatter or all-to-all)"));
}

class CollectiveBenchmarkTest : public ::testing::TestWithParam<CollectiveOp> {};

// "all_reduce", ...: the op's name as a test name.
std::string op_name(const ::testing::TestParamInfo<CollectiveOp>& param) {
  std::string name(to_string(param.param));
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return name;
}

TEST_P(CollectiveBenchmarkTest, GraphAndPlainLoopComputeTheCollective) {
  const auto devices = synthetic_devices("numa:2 core:1 pu:1");
  // 4 KiB is checked element by element, 1 MiB by stride (check()).
  for (std::size_t bytes : {std::size_t{4096}, std::size_t{1} << 20}) {
    GraphCollective graph(devices, GetParam(), bytes);
    EXPECT_EQ(graph.op(), GetParam());
    graph.run();
    EXPECT_TRUE(graph.check()) << to_string(GetParam()) << " " << bytes;
    graph.run();  // runs again on the same buffers
    EXPECT_TRUE(graph.check()) << to_string(GetParam()) << " " << bytes;
    PlainCollective plain(2, GetParam(), bytes);
    plain.run();
    EXPECT_TRUE(plain.check()) << to_string(GetParam()) << " " << bytes;
    plain.run();
    EXPECT_TRUE(plain.check()) << to_string(GetParam()) << " " << bytes;
  }
}

// 16-bit buffers: the same bytes hold twice the elements; the reductions' sums (up to 54 on two
// devices, 408 on eight) are rounded once, which check() expects (bf16 holds integers exactly
// only up to 256, so eight bf16 ranks exercise the rounding).
TEST_P(CollectiveBenchmarkTest, SixteenBitBuffersAreMovedAndReducedInFp32) {
  const auto devices = synthetic_devices("numa:2 core:1 pu:1");
  for (DType t : {DType::kBF16, DType::kF16}) {
    for (std::size_t bytes : {std::size_t{4096}, std::size_t{1} << 20}) {
      GraphCollective graph(devices, GetParam(), bytes, t);
      EXPECT_EQ(graph.dtype(), t);
      graph.run();
      EXPECT_TRUE(graph.check()) << to_string(GetParam()) << " " << to_string(t) << " " << bytes;
      PlainCollective plain(2, GetParam(), bytes, t);
      plain.run();
      EXPECT_TRUE(plain.check()) << to_string(GetParam()) << " " << to_string(t) << " " << bytes;
    }
    PlainCollective eight(8, GetParam(), 8 * 2 * 16, t);
    eight.run();
    EXPECT_TRUE(eight.check()) << to_string(GetParam()) << " " << to_string(t) << " on 8 threads";
  }
}

// Which rewrite_input nodes each node of `graph` waits for, directly or through others (node
// ids are in topological order: a node depends only on earlier ones).
std::vector<std::set<NodeId>> rewrites_before(const CompiledGraph& graph) {
  std::vector<std::set<NodeId>> before(graph.size());
  for (NodeId id = 0; id < graph.size(); ++id) {
    for (NodeId dep : graph.node(id).deps) {
      before[id].insert(before[dep].begin(), before[dep].end());
      if (graph.node(dep).name.starts_with("rewrite_input[")) before[id].insert(dep);
    }
  }
  return before;
}

// A chain's links each rewrite the inputs and then run the collective: every node of a link's
// collective waits for both rewrites of its link (checked on the graph's edges, since every
// link copies the same bytes and the outputs alone could not tell a missing edge). The inputs
// start zeroed, so a chain whose rewrites never ran gives wrong outputs.
TEST_P(CollectiveBenchmarkTest, ChainsRewriteTheInputsBeforeEveryCollective) {
  const auto devices = synthetic_devices("numa:2 core:1 pu:1");
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (std::size_t bytes : {std::size_t{4096}, std::size_t{1} << 20}) {
      GraphCollective graph(devices, GetParam(), bytes, t, 5);
      EXPECT_EQ(graph.chain(), 5u);
      const CompiledGraph& g = graph.graph();
      const auto before = rewrites_before(g);
      std::vector<NodeId> link_rewrites;  // the current link's
      std::size_t rewrites = 0, collective_nodes = 0;
      for (NodeId id = 0; id < g.size(); ++id) {
        if (g.node(id).name.starts_with("rewrite_input[")) {
          if (!link_rewrites.empty() && id > link_rewrites.back() + 1) link_rewrites.clear();
          link_rewrites.push_back(id);
          ++rewrites;
          continue;
        }
        ++collective_nodes;
        ASSERT_EQ(link_rewrites.size(), 2u) << g.node(id).name;
        for (NodeId r : link_rewrites) {
          EXPECT_TRUE(before[id].count(r) == 1)
              << g.node(id).name << " (node " << id << ") does not wait for node " << r;
        }
      }
      EXPECT_EQ(rewrites, 10u) << "five links on two devices";
      EXPECT_GE(collective_nodes, 10u);
      graph.run();
      EXPECT_TRUE(graph.check()) << to_string(GetParam()) << " " << to_string(t) << " " << bytes;
      graph.run();
      EXPECT_TRUE(graph.check()) << to_string(GetParam()) << " " << to_string(t) << " " << bytes;
      PlainCollective plain(2, GetParam(), bytes, t, 5);
      plain.run();
      EXPECT_TRUE(plain.check()) << to_string(GetParam()) << " " << to_string(t) << " " << bytes;
    }
  }
  PlainCollective eight(8, GetParam(), 8 * 4 * 16, DType::kF32, 3);
  eight.run();
  EXPECT_TRUE(eight.check()) << to_string(GetParam()) << " on 8 threads";
}

TEST_P(CollectiveBenchmarkTest, PlainLoopRunsWithMoreThreadsThanCpus) {
  // 8 threads on a machine that may have 2 CPUs: the barrier yields instead of spinning.
  PlainCollective plain(8, GetParam(), 8 * 4 * 16);
  plain.run();
  EXPECT_TRUE(plain.check());
}

INSTANTIATE_TEST_SUITE_P(AllOps, CollectiveBenchmarkTest,
                         ::testing::Values(CollectiveOp::kAllReduce, CollectiveOp::kAllGather,
                                           CollectiveOp::kReduceScatter, CollectiveOp::kAllToAll),
                         op_name);

TEST(GraphCollectiveTest, RefusesSizesTheDevicesCannotSplit) {
  const auto devices = synthetic_devices("numa:2 core:1 pu:1");
  EXPECT_THAT([&] { GraphCollective(devices, CollectiveOp::kAllReduce, 12); },
              ThrowsMessage<ValueError>(
                  "all-reduce: 12 bytes is not a positive multiple of 4 bytes (f32) x 2 devices"));
  EXPECT_THAT([&] { GraphCollective(devices, CollectiveOp::kAllGather, 6, DType::kBF16); },
              ThrowsMessage<ValueError>(
                  "all-gather: 6 bytes is not a positive multiple of 2 bytes (bf16) x 2 devices"));
  EXPECT_THAT([&] { GraphCollective(devices, CollectiveOp::kAllGather, 0); },
              ThrowsMessage<ValueError>(HasSubstr("0 bytes is not a positive multiple")));
  EXPECT_THAT(
      [&] { GraphCollective(devices, CollectiveOp::kAllReduce, 4096, DType::kF32, 0); },
      ThrowsMessage<ValueError>("all-reduce: a chain of 0 collectives runs nothing (1 or more)"));
  EXPECT_THAT(
      [] { PlainCollective(2, CollectiveOp::kAllGather, 4096, DType::kF32, 0); },
      ThrowsMessage<ValueError>("all-gather: a chain of 0 collectives runs nothing (1 or more)"));
  EXPECT_THAT([] { PlainCollective(3, CollectiveOp::kAllToAll, 16); },
              ThrowsMessage<ValueError>(
                  "all-to-all: 16 bytes is not a positive multiple of 4 bytes (f32) x 3 devices"));
}

TEST(MemcpyBaselineTest, CopiesAnySize) {
  for (std::size_t bytes : {std::size_t{1}, std::size_t{4096}, std::size_t{100003}}) {
    MemcpyBaseline copy(bytes);
    EXPECT_FALSE(copy.copied()) << bytes << " bytes: the destination starts as zeros";
    copy.run();
    EXPECT_TRUE(copy.copied()) << bytes << " bytes";
  }
}

TEST(MedianSecondsTest, CallsAtLeastRepeatsPlusWarmup) {
  int calls = 0;
  const double t = median_seconds([&] { ++calls; }, 5, 0.0);
  EXPECT_EQ(calls, 6);
  EXPECT_GE(t, 0.0);
}

TEST(MedianSecondsTest, RefusesBadArguments) {
  EXPECT_THAT([] { median_seconds([] {}, 0, 0.0); },
              ThrowsMessage<ValueError>("median_seconds: min_repeats 0 must be at least 1"));
  EXPECT_THAT([] { median_seconds([] {}, 1, -1.0); },
              ThrowsMessage<ValueError>("median_seconds: min_seconds -1 must not be negative"));
}

}  // namespace
}  // namespace numesh::diagnostics
