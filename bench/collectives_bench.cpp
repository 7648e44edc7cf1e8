// Collectives on the benchmark devices (bench_devices.hpp) against the plain shared-memory loop
// and memcpy, 4 KiB to 64 MiB per device. Each registers BM_<Op>_Graph beside
// BM_<Op>_PlainLoop, and BM_Memcpy covers the same sizes; compare rows of one run.
//   build/bench/bench/collectives_bench --benchmark_out=collectives.json

#include <benchmark/benchmark.h>

#include "bench_devices.hpp"
#include "collective_bench.hpp"

namespace numesh::bench {
namespace {

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

}  // namespace
}  // namespace numesh::bench
