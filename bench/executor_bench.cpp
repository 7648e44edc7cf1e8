// Scheduling cost: numesh graphs against a raw oneTBB flow graph of the same shape (one
// tbb::flow::graph of continue_nodes in the default arena), with empty node bodies so the
// figures are pure overhead. Counters: us_per_node.
//   chain        N nodes in a line on one device
//   pingpong     N nodes in a line alternating between two devices (every edge crosses)
//   layered      L layers of one node per device, each node waiting for the whole previous
//                layer (a barrier-like stage pattern, as collectives make)
//   stage        one node per device, then one node per device waiting for all of them: the
//                shape of a one-stage collective; its time is the latency of a small run
// BM_ForkJoin/<us> is the other kind of scheduling: a parallel_for of two chunks inside one
// device's arena, as a node body spreads its work over the device's threads (collectives'
// for_range, the kernels' parallel_blocks), each chunk busy for <us> microseconds. Counter:
// overhead_us, the time per call beyond one chunk's work. Run it with a device of two threads
// (NUMESH_BENCH_POLICY=numa on a one-node machine of two cores); with one thread per device
// both chunks run on the same thread and the overhead includes the second chunk's work.
//   build/bench/bench/executor_bench

#include <benchmark/benchmark.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>

#include <chrono>
#include <memory>
#include <vector>

#include "bench_devices.hpp"
#include "numesh/runtime/graph.hpp"

namespace numesh::bench {
namespace {

namespace flow = oneapi::tbb::flow;
using runtime::NodeId;

enum class Shape { kChain, kPingPong, kLayered, kStage };

int node_count(Shape shape, int devices) { return shape == Shape::kStage ? 2 * devices : 1000; }

// Predecessors of node i for each shape, over `devices` devices; device of node i.
std::vector<NodeId> preds(Shape shape, int i, int devices) {
  if (i == 0) return {};
  switch (shape) {
    case Shape::kChain:
    case Shape::kPingPong:
      return {static_cast<NodeId>(i - 1)};
    case Shape::kStage:
    case Shape::kLayered: {
      if (i < devices) return {};
      std::vector<NodeId> p;
      const int layer_start = (i / devices - 1) * devices;
      for (int k = 0; k < devices; ++k) p.push_back(static_cast<NodeId>(layer_start + k));
      return p;
    }
  }
  return {};
}

int device_of(Shape shape, int i, int devices) { return shape == Shape::kChain ? 0 : i % devices; }

void BM_Numesh(benchmark::State& state, Shape shape) {
  auto devices = bench_devices();
  const int d = static_cast<int>(devices->size());
  runtime::GraphBuilder b(devices);
  const int kNodes = node_count(shape, d);
  for (int i = 0; i < kNodes; ++i) {
    const auto p = preds(shape, i, d);
    b.add(
        device_of(shape, i, d), "n", [] {}, p);
  }
  runtime::CompiledGraph g = b.compile();
  for (auto _ : state) g.run();
  state.counters["us_per_node"] = benchmark::Counter(
      static_cast<double>(kNodes) * 1e-6,
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

void BM_RawTbb(benchmark::State& state, Shape shape) {
  const int d = static_cast<int>(bench_devices()->size());
  flow::graph g;
  flow::broadcast_node<flow::continue_msg> start(g);
  std::vector<std::unique_ptr<flow::continue_node<flow::continue_msg>>> nodes;
  const int kNodes = node_count(shape, d);
  for (int i = 0; i < kNodes; ++i) {
    nodes.push_back(std::make_unique<flow::continue_node<flow::continue_msg>>(
        g, [](const flow::continue_msg&) {}));
    const auto p = preds(shape, i, d);
    if (p.empty()) flow::make_edge(start, *nodes.back());
    for (NodeId j : p) flow::make_edge(*nodes[j], *nodes.back());
  }
  for (auto _ : state) {
    start.try_put(flow::continue_msg());
    g.wait_for_all();
  }
  state.counters["us_per_node"] = benchmark::Counter(
      static_cast<double>(kNodes) * 1e-6,
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

void spin_for(std::chrono::nanoseconds work) {
  const auto end = std::chrono::steady_clock::now() + work;
  while (std::chrono::steady_clock::now() < end) {
  }
}

void BM_ForkJoin(benchmark::State& state) {
  runtime::Device& device = bench_devices()->device(0);
  const std::chrono::nanoseconds work = std::chrono::microseconds(state.range(0));
  std::int64_t calls = 0;
  std::chrono::steady_clock::duration elapsed{};
  device.execute([&] {
    for (auto _ : state) {
      const auto t0 = std::chrono::steady_clock::now();
      oneapi::tbb::parallel_for(
          oneapi::tbb::blocked_range<int>(0, 2, 1),
          [&](const oneapi::tbb::blocked_range<int>& r) {
            for (int i = r.begin(); i != r.end(); ++i) spin_for(work);
          },
          oneapi::tbb::simple_partitioner());
      elapsed += std::chrono::steady_clock::now() - t0;
      ++calls;
    }
  });
  const double per_call_us =
      std::chrono::duration<double, std::micro>(elapsed).count() / static_cast<double>(calls);
  state.counters["overhead_us"] = per_call_us - static_cast<double>(state.range(0));
  state.counters["device_threads"] = device.spec().threads;
}

BENCHMARK_CAPTURE(BM_Numesh, chain, Shape::kChain)->UseRealTime();
BENCHMARK_CAPTURE(BM_RawTbb, chain, Shape::kChain)->UseRealTime();
BENCHMARK_CAPTURE(BM_Numesh, pingpong, Shape::kPingPong)->UseRealTime();
BENCHMARK_CAPTURE(BM_RawTbb, pingpong, Shape::kPingPong)->UseRealTime();
BENCHMARK_CAPTURE(BM_Numesh, layered, Shape::kLayered)->UseRealTime();
BENCHMARK_CAPTURE(BM_RawTbb, layered, Shape::kLayered)->UseRealTime();
BENCHMARK_CAPTURE(BM_Numesh, stage, Shape::kStage)->UseRealTime();
BENCHMARK_CAPTURE(BM_RawTbb, stage, Shape::kStage)->UseRealTime();
BENCHMARK(BM_ForkJoin)->Arg(0)->Arg(10)->UseRealTime();

}  // namespace
}  // namespace numesh::bench
