// The MLP forward of issue 4's yardstick: x[512, 1024], W1[1024, 4096], W2[4096, 1024], exact
// GELU, 8.59 GFLOP. numesh's sharded MLP on the benchmark devices (bench_devices.hpp: one per
// core on a one-node machine, so tp = 2 here) beside dense single-threaded Eigen and OpenBLAS
// with 2 threads, measured in the same run; PyTorch's figure comes from bench/mlp_torch.py.
// Baselines of its parts, on the same shapes:
//   BM_Gemm/<lib>   the up-projection GEMM alone, x[512, 1024] . W1[1024, 4096]: dense Eigen on
//                   one thread, OpenBLAS on one thread and on two (single-core efficiency of
//                   the two libraries, and what OpenBLAS's threading costs on this shape)
//   BM_Gemm16/<dtype>[_n256]  the same GEMM with the weights in bf16 or f16 by gemm_16bit (one
//                   thread, at the kernel level NUMESH_KERNELS selects, in the label: with
//                   avx512 or below bf16 takes the widened-OpenBLAS path), and numesh's fp32
//                   gemm() (single-threaded OpenBLAS) as f32 in the same run;
//                   _n256 is one column strip of 256 as a device_gemm tile multiplies it (b and
//                   c rows 4096 apart)
//   BM_DeviceGemm/<dtype>[_row_invariant]  the same GEMM by device_gemm on two threads with the
//                   weights stored out-in, in kF32 (the prefill tiles) and kRowInvariant (a
//                   serving engine's: row blocks of 16 through the decode kernels); block
//                   formats quantized by GGML's reference quantizers
//   BM_BlockTile/<format>_{packed,dequantized}  one prefill tile of block-format weights on one
//                   thread: int8 products on packed panels against the fp32 panels it replaced
//   BM_Gelu/<form>  the exact GELU on one thread over [512, 4096]: numesh's activation_inplace
//                   (Eigen's vectorized erf) against a scalar std::erf loop
//   BM_FmaPeak      fp32 peak of one core (and of two threads): independent chains of 256-bit
//                   FMAs, the figure "% of peak" is taken against
//   build/bench/bench/mlp_bench
// Counters: GFLOP/s (2*T*H*F*2 per forward; 2*M*N*K per GEMM; 2 per FMA lane); BM_Gelu has
// only its time.

#include <benchmark/benchmark.h>
#include <cblas.h>
#include <oneapi/tbb/task_arena.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>
#if defined(__AVX__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "bench_devices.hpp"
#include "numesh/ops/kernels/activations.hpp"
#include "numesh/ops/kernels/block_gemm.hpp"
#include "numesh/ops/kernels/gemm.hpp"
#include "numesh/ops/kernels/gemm_16bit.hpp"
#include "numesh/ops/lowering/mlp.hpp"
#include "numesh/runtime/convert.hpp"

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
  state.counters["GFLOP/s"] =
      benchmark::Counter(kFlops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
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
    ops::activation_inplace(ops::Activation::kGeluErf,
                            ops::MatrixMap(h.data(), h.rows(), h.cols()));
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
    ops::activation_inplace(ops::Activation::kGeluErf,
                            ops::MatrixMap(h.data(), h.rows(), h.cols()));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, kTokens, kHidden, kInter, 1.0f, h.data(),
                kInter, w2.data(), kHidden, 0.0f, y.data(), kHidden);
    benchmark::DoNotOptimize(y.data());
  }
  openblas_set_num_threads(1);  // numesh's devices call OpenBLAS single-threaded
  set_flops(state);
}

enum class GemmLib { kEigen, kOpenBlasOneThread, kOpenBlasTwoThreads };

// c[512, 4096] = x[512, 1024] . W1[1024, 4096], the MLP's up projection, by one library.
void BM_Gemm(benchmark::State& state, GemmLib lib) {
  const ops::RowMatrix x = matrix(random({kTokens, kHidden}, 3, 1.0f));
  const ops::RowMatrix w1 = matrix(random({kHidden, kInter}, 1, 0.02f));
  ops::RowMatrix h(kTokens, kInter);
  openblas_set_num_threads(lib == GemmLib::kOpenBlasTwoThreads ? 2 : 1);
  for (auto _ : state) {
    if (lib == GemmLib::kEigen) {
      h.noalias() = x * w1;  // Eigen is built without OpenMP: one thread
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, kTokens, kInter, kHidden, 1.0f,
                  x.data(), kHidden, w1.data(), kInter, 0.0f, h.data(), kInter);
    }
    benchmark::DoNotOptimize(h.data());
  }
  openblas_set_num_threads(1);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * kTokens * kHidden * kInter * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

// c[512, cols] = x[512, 1024] . W1[1024, :cols] with W1 stored as `t` (f32: numesh's gemm(), the
// baseline; bf16 / f16: gemm_16bit), b and c rows kInter apart: all of W1 (cols = kInter) or one
// column strip of it, as a device_gemm tile.
void BM_Gemm16(benchmark::State& state, DType t, std::int64_t cols) {
  const runtime::HostTensor x = random({kTokens, kHidden}, 3, 1.0f);
  const runtime::HostTensor w1 = random({kHidden, kInter}, 1, 0.02f);
  std::vector<std::uint16_t> w16(w1.data.size());
  if (t == DType::kBF16) runtime::convert_f32_to_bf16(w1.data, w16);
  if (t == DType::kF16) runtime::convert_f32_to_f16(w1.data, w16);
  std::vector<float> h(static_cast<std::size_t>(kTokens * kInter));
  openblas_set_num_threads(1);  // as numesh's gemm() runs it, whatever ran before
  for (auto _ : state) {
    if (t == DType::kF32) {
      ops::gemm(kTokens, cols, kHidden, 1.0f, x.data.data(), kHidden, w1.data.data(), kInter, false,
                0.0f, h.data(), kInter);
    } else {
      ops::gemm_16bit(
          kTokens, x.data.data(), kHidden,
          ops::WeightMatrix{w16.data(), t, kHidden, cols, ops::WeightLayout::kInOut, kInter},
          h.data(), kInter);
    }
    benchmark::DoNotOptimize(h.data());
  }
  state.SetLabel(t == DType::kF32 ? std::string("openblas")
                                  : std::string(runtime::to_string(runtime::kernel_level())));
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * kTokens * kHidden * static_cast<double>(cols) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
}

// c[512, 4096] = x[512, 1024] . W1 stored out-in as `t` ([4096, 1024], as the layers store
// it), by device_gemm over a two-thread arena in `precision`: kF32 (the prefill tiles) against
// kRowInvariant (row blocks of 16 through the decode kernels: what a serving engine's steps
// pay for batch invariance).
// `w` stored as `t` by the runtime's codec (GGML's reference quantizers for the block formats).
std::vector<std::byte> stored_as(const runtime::HostTensor& w, DType t) {
  std::vector<std::byte> out(
      static_cast<std::size_t>(row_bytes(t, static_cast<std::int64_t>(w.data.size()))));
  runtime::convert_elements(w.data.data(), DType::kF32, out.data(), t, w.data.size());
  return out;
}

void BM_DeviceGemm(benchmark::State& state, DType t, ops::MatmulPrecision precision) {
  const runtime::HostTensor x = random({kTokens, kHidden}, 3, 1.0f);
  const runtime::HostTensor w = random({kInter, kHidden}, 1, 0.02f);  // out-in
  const std::vector<std::byte> stored = stored_as(w, t);
  const void* data = stored.data();
  const ops::WeightMatrix b{data, t, kHidden, kInter, ops::WeightLayout::kOutIn};
  std::vector<float> h(static_cast<std::size_t>(kTokens * kInter));
  oneapi::tbb::task_arena arena(2);
  for (auto _ : state) {
    arena.execute([&] {
      ops::device_gemm(ops::ConstMatrixMap(x.data.data(), kTokens, kHidden), b,
                       ops::MatrixMap(h.data(), kTokens, kInter), precision);
    });
    benchmark::DoNotOptimize(h.data());
  }
  state.SetLabel(std::string(runtime::to_string(runtime::kernel_level())));
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * kTokens * kHidden * kInter * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

// One prefill tile of block-format weights on one thread, as device_gemm's tiles run it:
// x[256, 1024] by 256 outputs, the activations quantized once (untimed), by packed_gemm_q8 (int8
// products on packed panels) or by gemm_dequantized (fp32 panels through OpenBLAS, on the
// activations' fp32 values), the baseline it replaced.
void BM_BlockTile(benchmark::State& state, DType t, bool packed, bool panels = false) {
  constexpr std::int64_t kRows = 256, kCols = 256;
  const runtime::HostTensor x = random({kRows, kHidden}, 3, 1.0f);
  const runtime::HostTensor w = random({kCols, kHidden}, 1, 0.02f);  // out-in
  std::vector<std::byte> stored = stored_as(w, t);
  ops::WeightMatrix b{stored.data(), t, kHidden, kCols, ops::WeightLayout::kOutIn};
  if (panels) {  // stored as a model's weights are (runtime/weight_panels.hpp)
    runtime::rows_to_panels_in_place(t, kCols, kHidden, stored);
    b.panel_outputs = kCols;
  }
  std::vector<std::int8_t> codes(static_cast<std::size_t>(kRows * kHidden));
  std::vector<float> scales(static_cast<std::size_t>(kRows * kHidden / 32));
  ops::quantize_activations_q8(kRows, kHidden, x.data.data(), kHidden, codes.data(), scales.data());
  std::vector<float> c(static_cast<std::size_t>(kRows * kCols));
  for (auto _ : state) {
    if (packed) {
      ops::packed_gemm_q8(kRows, codes.data(), scales.data(), b, c.data(), kCols);
    } else {
      ops::gemm_dequantized(kRows, x.data.data(), kHidden, b, c.data(), kCols);
    }
    benchmark::DoNotOptimize(c.data());
  }
  state.SetLabel(std::string(runtime::to_string(runtime::kernel_level())));
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * kRows * kHidden * kCols * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

// GELU over an activation of the MLP's [512, 4096] (values of the spread x . W1 has), on one
// thread: activation_inplace (kGeluErf) inside a one-thread arena, or a scalar std::erf loop. Each
// iteration starts again from the same values (copied in untimed).
void BM_Gelu(benchmark::State& state, bool vectorized) {
  const runtime::HostTensor source = random({kTokens, kInter}, 4, 0.64f);
  runtime::HostTensor h = source;
  oneapi::tbb::task_arena one_thread(1);
  one_thread.execute([&] {
    for (auto _ : state) {
      state.PauseTiming();
      std::memcpy(h.data.data(), source.data.data(), h.data.size() * sizeof(float));
      state.ResumeTiming();
      if (vectorized) {
        ops::activation_inplace(ops::Activation::kGeluErf,
                                ops::MatrixMap(h.data.data(), kTokens, kInter));
      } else {
        for (float& v : h.data) v = 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752440f));
      }
      benchmark::DoNotOptimize(h.data.data());
    }
  });
}

#if defined(__AVX__) && defined(__FMA__)
// 12 independent chains of 256-bit fp32 FMAs (enough to cover the FMA latency on both pipes of
// a Zen 4 core, and few enough to stay in the 16 ymm registers of AVX2), per thread.
void BM_FmaPeak(benchmark::State& state) {
  constexpr int kChains = 12;
  constexpr int kSteps = 1 << 16;
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(1e-3f * static_cast<float>(c));
  const __m256 a = _mm256_set1_ps(0.999f);
  const __m256 b = _mm256_set1_ps(1e-3f);
  for (auto _ : state) {
    for (int s = 0; s < kSteps; ++s) {
      for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
    }
    for (int c = 0; c < kChains; ++c) benchmark::DoNotOptimize(acc[c]);
  }
  // Per thread, then summed over the threads: the rate of all of them together.
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * 8 * kChains * kSteps * 1e-9,
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kAvgThreads);
}
#endif

BENCHMARK(BM_Mlp_Sharded)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Mlp_ShardedDp)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Mlp_EigenSingleThread)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Mlp_OpenBlasTwoThreads)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Gemm, Eigen1, GemmLib::kEigen)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Gemm, OpenBlas1, GemmLib::kOpenBlasOneThread)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Gemm, OpenBlas2, GemmLib::kOpenBlasTwoThreads)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_DeviceGemm, f32, DType::kF32, ops::MatmulPrecision::kF32)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_DeviceGemm, f32_row_invariant, DType::kF32,
                  ops::MatmulPrecision::kRowInvariant)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_DeviceGemm, bf16, DType::kBF16, ops::MatmulPrecision::kF32)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_DeviceGemm, bf16_row_invariant, DType::kBF16,
                  ops::MatmulPrecision::kRowInvariant)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_DeviceGemm, q8_0, DType::kQ8_0, ops::MatmulPrecision::kF32)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_DeviceGemm, q8_0_row_invariant, DType::kQ8_0,
                  ops::MatmulPrecision::kRowInvariant)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_DeviceGemm, q4_0, DType::kQ4_0, ops::MatmulPrecision::kF32)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_DeviceGemm, q4_0_row_invariant, DType::kQ4_0,
                  ops::MatmulPrecision::kRowInvariant)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_DeviceGemm, q4_k, DType::kQ4_K, ops::MatmulPrecision::kF32)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_DeviceGemm, q6_k, DType::kQ6_K, ops::MatmulPrecision::kF32)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_BlockTile, q8_0_packed, DType::kQ8_0, true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_BlockTile, q8_0_panels, DType::kQ8_0, true, true)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_BlockTile, q4_0_panels, DType::kQ4_0, true, true)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_BlockTile, q8_0_dequantized, DType::kQ8_0, false)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_BlockTile, q4_0_packed, DType::kQ4_0, true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_BlockTile, q4_0_dequantized, DType::kQ4_0, false)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_BlockTile, q4_k_packed, DType::kQ4_K, true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_BlockTile, q4_k_dequantized, DType::kQ4_K, false)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_BlockTile, q6_k_packed, DType::kQ6_K, true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_BlockTile, q6_k_dequantized, DType::kQ6_K, false)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Gemm16, f32, DType::kF32, kInter)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Gemm16, bf16, DType::kBF16, kInter)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Gemm16, f16, DType::kF16, kInter)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Gemm16, f32_n256, DType::kF32, 256)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Gemm16, bf16_n256, DType::kBF16, 256)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Gemm16, f16_n256, DType::kF16, 256)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Gelu, Vectorized, true)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Gelu, ScalarErf, false)->UseRealTime()->Unit(benchmark::kMillisecond);
#if defined(__AVX__) && defined(__FMA__)
BENCHMARK(BM_FmaPeak)->Threads(1)->Threads(2)->UseRealTime();
#endif

}  // namespace
}  // namespace numesh::bench
