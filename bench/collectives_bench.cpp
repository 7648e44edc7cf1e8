// Collectives on the benchmark devices (bench_devices.hpp) against the plain shared-memory loop
// and memcpy, 4 KiB to 64 MiB per device: the cases of numesh/diagnostics/collective_benchmark.hpp,
// the same that `numesh bench collectives` times. Each registers BM_Graph/<Op> beside
// BM_PlainLoop/<Op>, and BM_Memcpy covers the same sizes; compare rows of one run.
// BM_GraphChain runs 64 all-reduces back to back inside one graph run, each after the devices
// rewrite their inputs, and reports the time per all-reduce: the latency of a collective between
// busy devices, as in a model's step, rather than that of a run that must first wake idle ones.
// BM_PlainLoopChain is the plain loop's threads running the same chain.
//   build/bench/bench/collectives_bench --benchmark_out=collectives.json

#include <benchmark/benchmark.h>

#include <cstddef>

#include "bench_devices.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/diagnostics/collective_benchmark.hpp"

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

// 64 all-reduces in one run, each after every device rewrote its input (the diagnostics'
// chain); reported per all-reduce.
constexpr std::size_t kLinks = 64;

void set_chain_counters(benchmark::State& state, std::size_t bytes) {
  state.counters["us_per_allreduce"] = benchmark::Counter(
      kLinks * 1e-6, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.counters["bytes_per_device"] = static_cast<double>(bytes);
}

void BM_GraphChain(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  GraphCollective c(bench_devices(), CollectiveOp::kAllReduce, bytes, DType::kF32, kLinks);
  for (auto _ : state) c.run();
  if (!c.check()) state.SkipWithError("wrong result");
  set_chain_counters(state, bytes);
}

void BM_PlainLoopChain(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  PlainCollective c(static_cast<int>(bench_devices()->size()), CollectiveOp::kAllReduce, bytes,
                    DType::kF32, kLinks);
  for (auto _ : state) c.run();
  if (!c.check()) state.SkipWithError("wrong result");
  set_chain_counters(state, bytes);
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
BENCHMARK(BM_PlainLoopChain)->Arg(4 << 10)->Arg(64 << 10)->Arg(1 << 20)->UseRealTime();

}  // namespace
}  // namespace numesh::bench
