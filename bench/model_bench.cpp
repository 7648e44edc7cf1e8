// A model's calls in C++, the baseline of the Python package's model calls (bench/python_bench.py
// times the same calls through `import numesh` on the same model):
//   BM_Logits/T   CausalLm::logits of T ids from position 0 (the model numesh.CausalLM loads:
//                 models::Engine on the machine's devices over tp, f32)
//
//   NUMESH_BENCH_MODEL=/tmp/m100 build/portable/bench/model_bench
// Without NUMESH_BENCH_MODEL the case is skipped with a message.

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <random>
#include <vector>

#include "numesh/models/engine/engine.hpp"
#include "numesh/models/engine/model_source.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/topology.hpp"

namespace numesh::bench {
namespace {

// The model of NUMESH_BENCH_MODEL, loaded once as CausalLM.from_pretrained loads it by default.
models::Engine* engine() {
  static std::optional<models::Engine> loaded = []() -> std::optional<models::Engine> {
    const char* path = std::getenv("NUMESH_BENCH_MODEL");
    if (path == nullptr) return std::nullopt;
    return models::Engine::load(
        models::ModelSource::open(path),
        runtime::DeviceMesh::create(runtime::DeviceSet::create(runtime::Topology::discover()),
                                    {1, 1, -1}, {"dp", "ep", "tp"}));
  }();
  return loaded ? &*loaded : nullptr;
}

void BM_Logits(benchmark::State& state) {
  models::Engine* e = engine();
  if (e == nullptr) {
    state.SkipWithError("set NUMESH_BENCH_MODEL to a model folder");
    return;
  }
  std::mt19937 rng(1);
  std::uniform_int_distribution<std::int32_t> id(3, 999);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(state.range(0)));
  for (auto& i : ids) i = id(rng);
  for (auto _ : state) {
    benchmark::DoNotOptimize(e->model().logits(ids, state.range(0), 0));
  }
}
BENCHMARK(BM_Logits)->Arg(32)->Arg(128)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace numesh::bench
