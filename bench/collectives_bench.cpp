// Collectives on the benchmark devices (bench_devices.hpp) against the plain shared-memory loop
// and memcpy, 4 KiB to 64 MiB per device: the cases of numesh/diagnostics/collective_benchmark.hpp,
// the same that `numesh bench collectives` times. Each registers BM_Graph/<Op> beside
// BM_PlainLoop/<Op>, and BM_Memcpy covers the same sizes; compare rows of one run.
// BM_GraphChain runs 64 all-reduces back to back inside one graph run and reports
// the time per all-reduce: the latency of a collective between busy devices, as in a real
// program, rather than that of a run that must first wake idle ones.
//   build/bench/bench/collectives_bench --benchmark_out=collectives.json

#include <benchmark/benchmark.h>

#include <vector>

#include "bench_devices.hpp"
#include "numesh/diagnostics/collective_benchmark.hpp"
#include "numesh/runtime/collectives.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/tensor.hpp"

namespace numesh::bench {
namespace {

using diagnostics::CollectiveOp;
using diagnostics::GraphCollective;
using diagnostics::MemcpyBaseline;
using diagnostics::PlainCollective;

void set_counters(benchmark::State& state, std::size_t bytes) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(bytes));
  state.counters["bytes_per_device"] = static_cast<double>(bytes);
}

void BM_Graph(benchmark::State& state, CollectiveOp op) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  GraphCollective c(bench_devices(), op, bytes);
  for (auto _ : state) c.run();
  if (!c.check()) state.SkipWithError("wrong result");
  set_counters(state, bytes);
}

void BM_PlainLoop(benchmark::State& state, CollectiveOp op) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  PlainCollective c(static_cast<int>(bench_devices()->size()), op, bytes);
  for (auto _ : state) c.run();
  if (!c.check()) state.SkipWithError("wrong result");
  set_counters(state, bytes);
}

void BM_Memcpy(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  MemcpyBaseline c(bytes);
  for (auto _ : state) c.run();
  set_counters(state, bytes);
}

void BM_GraphChain(benchmark::State& state) {
  constexpr int kLinks = 64;
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::size_t count = bytes / sizeof(float);
  auto devices = bench_devices();
  const auto mesh = runtime::DeviceMesh::create(devices, {-1}, {"x"});
  // Two buffer sets used in turn: all-reduce k reads set k % 2 and writes the other. The
  // inputs start at zero, so the sums stay zero (finite) however long the chain.
  std::vector<runtime::Tensor> sets[2];
  std::vector<runtime::BufferView> views[2];
  for (auto& set : sets) {
    for (std::int64_t s = 0; s < mesh.size(); ++s) {
      set.emplace_back(mesh.device(s), std::vector<std::int64_t>{static_cast<std::int64_t>(count)});
    }
  }
  for (int k = 0; k < 2; ++k) {
    for (auto& t : sets[k]) views[k].push_back(runtime::view(t));
  }
  runtime::GraphBuilder b(devices);
  runtime::Frontier f;
  for (int k = 0; k < kLinks; ++k) {
    f = runtime::all_reduce(b, mesh, views[k % 2], views[(k + 1) % 2], count,
                            runtime::ReduceOp::kSum, {.axes = {"x"}, .after = f, .name = {}});
  }
  runtime::CompiledGraph g = b.compile();
  for (auto _ : state) g.run();
  state.counters["us_per_allreduce"] = benchmark::Counter(
      kLinks * 1e-6, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.counters["bytes_per_device"] = static_cast<double>(bytes);
}

void sizes(benchmark::internal::Benchmark* b) {
  b->RangeMultiplier(4)->Range(4 << 10, 64 << 20)->UseRealTime();
}

BENCHMARK_CAPTURE(BM_Graph, AllReduce, CollectiveOp::kAllReduce)->Apply(sizes);
BENCHMARK_CAPTURE(BM_PlainLoop, AllReduce, CollectiveOp::kAllReduce)->Apply(sizes);
BENCHMARK_CAPTURE(BM_Graph, AllGather, CollectiveOp::kAllGather)->Apply(sizes);
BENCHMARK_CAPTURE(BM_PlainLoop, AllGather, CollectiveOp::kAllGather)->Apply(sizes);
BENCHMARK_CAPTURE(BM_Graph, ReduceScatter, CollectiveOp::kReduceScatter)->Apply(sizes);
BENCHMARK_CAPTURE(BM_PlainLoop, ReduceScatter, CollectiveOp::kReduceScatter)->Apply(sizes);
BENCHMARK_CAPTURE(BM_Graph, AllToAll, CollectiveOp::kAllToAll)->Apply(sizes);
BENCHMARK_CAPTURE(BM_PlainLoop, AllToAll, CollectiveOp::kAllToAll)->Apply(sizes);
BENCHMARK(BM_Memcpy)->Apply(sizes);
BENCHMARK(BM_GraphChain)->Arg(4 << 10)->Arg(64 << 10)->Arg(1 << 20)->UseRealTime();

}  // namespace
}  // namespace numesh::bench
