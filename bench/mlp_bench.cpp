// The MLP forward of issue 4's yardstick: x[512, 1024], W1[1024, 4096], W2[4096, 1024], exact
// GELU, 8.59 GFLOP. numesh's sharded MLP on the benchmark devices (bench_devices.hpp: one per
// core on a one-node machine, so tp = 2 here) beside dense single-threaded Eigen and OpenBLAS
// with 2 threads, measured in the same run; PyTorch's figure comes from bench/mlp_torch.py.
//   build/bench/bench/mlp_bench
// Counters: GFLOP/s (2*T*H*F*2 per forward).

#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cmath>
#include <random>

#include "bench_devices.hpp"
#include "numesh/ops/kernels/activations.hpp"
#include "numesh/ops/lowering/mlp.hpp"

extern "C" void openblas_set_num_threads(int num_threads);

namespace numesh::bench {
namespace {

constexpr std::int64_t kTokens = 512, kHidden = 1024, kInter = 4096;
constexpr double kFlops = 2.0 * 2.0 * kTokens * kHidden * kInter;

runtime::HostTensor random(std::vector<std::int64_t> shape, std::uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  runtime::HostTensor t = runtime::HostTensor::zeros(std::move(shape));
  for (float& v : t.data) v = normal(rng);
  return t;
}

ops::RowMatrix matrix(const runtime::HostTensor& t) {
  return Eigen::Map<const ops::RowMatrix>(t.data.data(), t.shape[0], t.shape[1]);
}

void set_flops(benchmark::State& state) {
  state.counters["GFLOP/s"] = benchmark::Counter(kFlops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// numesh's MLP over the benchmark devices laid out as one `axis`, timing the compiled graph.
void run_sharded_mlp(benchmark::State& state, const char* axis) {
  const auto mesh = runtime::DeviceMesh::create(bench_devices(), {-1}, {axis});
  ops::MlpWeights w;
  w.up = random({kHidden, kInter}, 1, 0.02f);
  w.down = random({kInter, kHidden}, 2, 0.02f);
  ops::ShardedMlp mlp(mesh, ops::MlpKind::kGelu, w, kTokens);
  const runtime::HostTensor x = random({kTokens, kHidden}, 3, 1.0f);
  mlp.forward(x);  // binds x; the loop times the compiled graph only
  for (auto _ : state) mlp.graph().run();
  set_flops(state);
}

// F over tp: column/row-parallel weights, one all-reduce of the 2 MiB output.
void BM_Mlp_Sharded(benchmark::State& state) { run_sharded_mlp(state, "tp"); }
// Data parallel: each device takes half the tokens with whole weights; no collective at all,
// the GEMMs twice as wide and half as tall.
void BM_Mlp_ShardedDp(benchmark::State& state) { run_sharded_mlp(state, "dp"); }

void BM_Mlp_EigenSingleThread(benchmark::State& state) {
  const ops::RowMatrix x = matrix(random({kTokens, kHidden}, 3, 1.0f));
  const ops::RowMatrix w1 = matrix(random({kHidden, kInter}, 1, 0.02f));
  const ops::RowMatrix w2 = matrix(random({kInter, kHidden}, 2, 0.02f));
  ops::RowMatrix h(kTokens, kInter), y(kTokens, kHidden);
  for (auto _ : state) {
    h.noalias() = x * w1;
    ops::gelu_inplace(ops::MatrixMap(h.data(), h.rows(), h.cols()));
    y.noalias() = h * w2;
    benchmark::DoNotOptimize(y.data());
  }
  set_flops(state);
}

void BM_Mlp_OpenBlasTwoThreads(benchmark::State& state) {
  const ops::RowMatrix x = matrix(random({kTokens, kHidden}, 3, 1.0f));
  const ops::RowMatrix w1 = matrix(random({kHidden, kInter}, 1, 0.02f));
  const ops::RowMatrix w2 = matrix(random({kInter, kHidden}, 2, 0.02f));
  ops::RowMatrix h(kTokens, kInter), y(kTokens, kHidden);
  openblas_set_num_threads(2);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, kTokens, kInter, kHidden, 1.0f, x.data(),
                kHidden, w1.data(), kInter, 0.0f, h.data(), kInter);
    ops::gelu_inplace(ops::MatrixMap(h.data(), h.rows(), h.cols()));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, kTokens, kHidden, kInter, 1.0f, h.data(),
                kInter, w2.data(), kHidden, 0.0f, y.data(), kHidden);
    benchmark::DoNotOptimize(y.data());
  }
  openblas_set_num_threads(1);  // numesh's devices call OpenBLAS single-threaded
  set_flops(state);
}

BENCHMARK(BM_Mlp_Sharded)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Mlp_ShardedDp)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Mlp_EigenSingleThread)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Mlp_OpenBlasTwoThreads)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace numesh::bench
