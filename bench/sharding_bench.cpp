// The sharding layer's resolution calls in C++, the baseline of the Python package's call
// overhead (bench/python_bench.py times the same calls through `import numesh`).
//   BM_ResolveSpec          PartitionAxis::resolve_spec of [BATCH, QUERY_LENGTH, EMBED], train
//   BM_ManagerResolvePreset PartitionManager::resolve of HiddenStateSharding on (8, 1, 4096)
//   build/portable/bench/sharding_bench

#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "numesh/sharding/partition_axis.hpp"
#include "numesh/sharding/partition_manager.hpp"
#include "numesh/sharding/presets.hpp"
#include "numesh/sharding/semantic_axis.hpp"

namespace numesh::bench {
namespace {

namespace sh = sharding;

void BM_ResolveSpec(benchmark::State& state) {
  const sh::PartitionAxis paxis;
  const std::vector<sh::AxisRule> axes{sh::tokens::kBatch, sh::tokens::kQueryLength,
                                       sh::tokens::kEmbed};
  for (auto _ : state) benchmark::DoNotOptimize(paxis.resolve_spec(axes, sh::Mode::kTrain));
}
BENCHMARK(BM_ResolveSpec);

void BM_ManagerResolvePreset(benchmark::State& state) {
  const sh::PartitionManager manager;
  const std::vector<std::int64_t> shape{8, 1, 4096};
  for (auto _ : state) {
    benchmark::DoNotOptimize(manager.resolve(sh::presets::kHiddenStateSharding, shape));
  }
}
BENCHMARK(BM_ManagerResolvePreset);

}  // namespace
}  // namespace numesh::bench
