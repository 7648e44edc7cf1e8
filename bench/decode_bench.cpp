// decode_bench: the decode kernel against the memory it streams, in one run.
//
//   build/release/bench/decode_bench --benchmark_min_time=1
//
// A decode step multiplies a few rows of activations by every weight once: it is bound by
// reading the weights. Each case runs over all threads of the default oneTBB arena (the
// machine's threads) on a [K, N] = [4096, 14336] weight matrix (a Llama-3-8B MLP projection):
//   BM_Decode_Read          a plain parallel read (sum) of the fp32 matrix: the ceiling;
//   BM_Decode_Gemv<dtype>/M column strips of skinny_gemm with M rows of x against fp32, bf16
//                           or f16 weights (device_gemm's path for decode products under 1 MiB);
//   BM_Decode_DeviceGemm<dtype>/M  device_decode_gemm: the path the layers take for decode
//                           (blocks of whole rows, partials summed in order);
//   BM_Decode_OpenBlas/M    cblas_sgemm per strip, the same tiles (the decode path before
//                           skinny_gemm).
//   BM_Decode_Dot<dtype>/M/level/N  one thread's out-in decode kernel on [4096, N] weights
//                           (N = 1024: 8 MiB of bf16, in L3; N = 8192: beyond it): dot_gemm
//                           on fp32 weights (serving's row-invariant products), dot_gemm_bf16
//                           on bf16 activations, dot_gemm_blocks (q8_0, q4_0, q4_k, q6_k) on
//                           activations quantized once outside the loop
//                           (quantize_activations_q8 is timed apart, as
//                           BM_Decode_QuantizeActivations/M/level); <dtype, true>: q8_0 or
//                           q4_0 weights stored in panels of 16 outputs, as the layers store
//                           them where they pay (from avx2);
//                           <dtype, true, true>: the same panels
//                           by the prefill tile, packed_gemm_q8 (the other order: what a
//                           row-invariant product would pay at each row count if it took it).
//   BM_Decode_Attention<kv dtype>/P/D  one token's attention over P positions of a model's
//                           layers of caches (bhtd: attention_core as a layer calls it), each
//                           layer's own, with a layer's share of 60 MB of other memory read
//                           between layers, untimed (a q4_0 step's weights), so that the caches
//                           come from memory as in a model: D = 64, the 109 M Llama's 12 layers
//                           of 12 query heads over 3 kv heads; D = 128, 4 layers of Llama 3 8B's
//                           32 over 8. The level is NUMESH_KERNELS's. Counter bytes_per_second:
//                           cache bytes.
// Counter "bytes_per_second": weight bytes read per second (fp32: 4 bytes a weight, 16-bit
// dtypes 2, q8_0 34 bytes per 32, q4_0 18, q4_k 144 per 256, q6_k 210); the Read case counts
// its array.

#include <benchmark/benchmark.h>
#include <cblas.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/parallel_reduce.h>
#include <oneapi/tbb/partitioner.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "numesh/core/dtype.hpp"
#include "numesh/ops/kernels/attention_core.hpp"
#include "numesh/ops/kernels/block_gemm.hpp"
#include "numesh/ops/kernels/dot_gemm.hpp"
#include "numesh/ops/kernels/gemm.hpp"
#include "numesh/ops/kernels/key_block.hpp"
#include "numesh/ops/kernels/skinny_gemm.hpp"
#include "numesh/runtime/block_formats.hpp"
#include "numesh/runtime/convert.hpp"
#include "numesh/runtime/cpu_features.hpp"
#include "numesh/runtime/weight_panels.hpp"

extern "C" void openblas_set_num_threads(int num_threads);

namespace numesh::bench {
namespace {

constexpr std::int64_t kK = 4096, kN = 14336;

const std::vector<float>& weights_f32() {
  static const std::vector<float> w = [] {
    std::vector<float> v(static_cast<std::size_t>(kK * kN));
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (float& x : v) x = normal(rng);
    return v;
  }();
  return w;
}

const std::vector<std::uint16_t>& weights_16(DType t) {
  static const std::vector<std::uint16_t> bf = [] {
    std::vector<std::uint16_t> v(weights_f32().size());
    runtime::convert_f32_to_bf16(weights_f32(), v);
    return v;
  }();
  static const std::vector<std::uint16_t> h = [] {
    std::vector<std::uint16_t> v(weights_f32().size());
    runtime::convert_f32_to_f16(weights_f32(), v);
    return v;
  }();
  return t == DType::kBF16 ? bf : h;
}

void BM_Decode_Read(benchmark::State& state) {
  const std::vector<float>& w = weights_f32();
  const auto n = static_cast<std::int64_t>(w.size());
  for (auto _ : state) {
    const float sum = oneapi::tbb::parallel_reduce(
        oneapi::tbb::blocked_range<std::int64_t>(0, n, n / 64), 0.0f,
        [&](const oneapi::tbb::blocked_range<std::int64_t>& r, float s) {
          float a0 = 0, a1 = 0, a2 = 0, a3 = 0;  // independent sums: the loop vectorizes
          std::int64_t i = r.begin();
          for (; i + 4 <= r.end(); i += 4) {
            a0 += w[static_cast<std::size_t>(i)];
            a1 += w[static_cast<std::size_t>(i + 1)];
            a2 += w[static_cast<std::size_t>(i + 2)];
            a3 += w[static_cast<std::size_t>(i + 3)];
          }
          for (; i < r.end(); ++i) a0 += w[static_cast<std::size_t>(i)];
          return s + (a0 + a1) + (a2 + a3);
        },
        [](float a, float b) { return a + b; }, oneapi::tbb::static_partitioner());
    benchmark::DoNotOptimize(sum);
  }
  state.counters["bytes_per_second"] = benchmark::Counter(
      static_cast<double>(n) * 4.0, benchmark::Counter::kIsIterationInvariantRate);
}

// The column strips device_gemm uses for a decode product, each strip one call of `strip`.
template <typename Strip>
void strips(std::int64_t m, const Strip& strip) {
  const ops::GemmTiling t = ops::gemm_tiling(m, kN, kK);
  const std::int64_t tiles = t.col_tiles(kN);
  oneapi::tbb::parallel_for(
      oneapi::tbb::blocked_range<std::int64_t>(0, tiles, 1),
      [&](const oneapi::tbb::blocked_range<std::int64_t>& r) {
        for (std::int64_t i = r.begin(); i != r.end(); ++i) {
          const std::int64_t c0 = i * t.col_block;
          strip(c0, std::min(t.col_block, kN - c0));
        }
      },
      oneapi::tbb::simple_partitioner());
}

template <DType T>
void BM_Decode_Gemv(benchmark::State& state) {
  const std::int64_t m = state.range(0);
  std::vector<float> x(static_cast<std::size_t>(m * kK), 0.5f), y(static_cast<std::size_t>(m * kN));
  const void* b = T == DType::kF32 ? static_cast<const void*>(weights_f32().data())
                                   : static_cast<const void*>(weights_16(T).data());
  for (auto _ : state) {
    strips(m, [&](std::int64_t c0, std::int64_t cols) {
      ops::skinny_gemm(m, x.data(), kK, ops::WeightMatrix{b, T, kK, kN}.outputs(c0, cols),
                       y.data() + c0, kN);
    });
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["bytes_per_second"] =
      benchmark::Counter(static_cast<double>(kK * kN) * static_cast<double>(dtype_size(T)),
                         benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(to_string(T)) + ", " +
                 std::string(runtime::to_string(runtime::kernel_level())));
}

// The path numesh's layers take: device_decode_gemm (what device_gemm runs for fp32), blocks of
// whole rows with partials summed in order, for each weight dtype.
template <DType T>
void BM_Decode_DeviceGemm(benchmark::State& state) {
  const std::int64_t m = state.range(0);
  std::vector<float> x(static_cast<std::size_t>(m * kK), 0.5f), y(static_cast<std::size_t>(m * kN));
  const void* b = T == DType::kF32 ? static_cast<const void*>(weights_f32().data())
                                   : static_cast<const void*>(weights_16(T).data());
  for (auto _ : state) {
    ops::device_decode_gemm(ops::ConstMatrixMap(x.data(), m, kK), ops::WeightMatrix{b, T, kK, kN},
                            ops::MatrixMap(y.data(), m, kN));
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["bytes_per_second"] =
      benchmark::Counter(static_cast<double>(kK * kN) * static_cast<double>(dtype_size(T)),
                         benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(to_string(T)));
}

void BM_Decode_OpenBlas(benchmark::State& state) {
  openblas_set_num_threads(1);
  const std::int64_t m = state.range(0);
  std::vector<float> x(static_cast<std::size_t>(m * kK), 0.5f), y(static_cast<std::size_t>(m * kN));
  const float* b = weights_f32().data();
  for (auto _ : state) {
    strips(m, [&](std::int64_t c0, std::int64_t cols) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m),
                  static_cast<int>(cols), static_cast<int>(kK), 1.0f, x.data(),
                  static_cast<int>(kK), b + c0, static_cast<int>(kN), 0.0f, y.data() + c0,
                  static_cast<int>(kN));
    });
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["bytes_per_second"] = benchmark::Counter(
      static_cast<double>(kK * kN) * 4.0, benchmark::Counter::kIsIterationInvariantRate);
}

// One thread's decode kernel on out-in weights [kDotK, N] of dtype T (bf16 or a block format), from
// the first N outputs' rows of the shared matrix (transposed view: any N k-runs of normal
// values serve).
constexpr std::int64_t kDotK = 4096;

template <DType T>
const std::vector<std::uint16_t>& dot_weights(std::int64_t n) {
  static std::vector<std::uint16_t> stored;
  static std::int64_t stored_n = 0;
  if (stored_n != n) {
    const std::int64_t row = row_bytes(T, kDotK);
    stored.assign(static_cast<std::size_t>((n * row + 1) / 2), 0);
    auto* bytes = reinterpret_cast<unsigned char*>(stored.data());
    for (std::int64_t j = 0; j < n; ++j) {
      const std::span<const float> x(weights_f32().data() + j * kDotK,
                                     static_cast<std::size_t>(kDotK));
      const auto blocks = static_cast<std::size_t>(kDotK / traits(T).block_elements);
      unsigned char* at = bytes + j * row;
      if constexpr (T == DType::kBF16) {
        runtime::convert_f32_to_bf16(x, {stored.data() + j * kDotK, x.size()});
      } else if constexpr (T == DType::kQ8_0) {
        runtime::quantize_q8_0(x, {reinterpret_cast<runtime::BlockQ8_0*>(at), blocks});
      } else if constexpr (T == DType::kQ4_0) {
        runtime::quantize_q4_0(x, {reinterpret_cast<runtime::BlockQ4_0*>(at), blocks});
      } else if constexpr (T == DType::kQ4_K) {
        runtime::quantize_q4_k(x, {reinterpret_cast<runtime::BlockQ4_K*>(at), blocks});
      } else {
        runtime::quantize_q6_k(x, {reinterpret_cast<runtime::BlockQ6_K*>(at), blocks});
      }
    }
    stored_n = n;
  }
  return stored;
}

// dot_weights<T>(n) in panels (runtime/weight_panels.hpp), for Q8_0 and Q4_0.
template <DType T>
const std::vector<std::uint16_t>& dot_panels(std::int64_t n) {
  static std::vector<std::uint16_t> panels;
  static std::int64_t panels_n = 0;
  if (panels_n != n) {
    const std::vector<std::uint16_t>& rows = dot_weights<T>(n);
    panels.assign(rows.size(), 0);
    const auto bytes = static_cast<std::size_t>(n * row_bytes(T, kDotK));
    runtime::rows_to_panels(T, n, kDotK, std::as_bytes(std::span(rows)).first(bytes),
                            std::as_writable_bytes(std::span(panels)).first(bytes));
    panels_n = n;
  }
  return panels;
}

// kPanels: the weights stored in panels, as the layers store Q8_0 and Q4_0 from avx2.
// kTile: multiplied by the prefill tile (packed_gemm_q8) instead of the format's dot kernel.
template <DType T, bool kPanels = false, bool kTile = false>
void BM_Decode_Dot(benchmark::State& state) {
  const std::int64_t m = state.range(0), n = state.range(2);
  const auto level = static_cast<runtime::KernelLevel>(state.range(1));
  const std::vector<runtime::KernelLevel> runnable = runtime::runnable_kernel_levels();
  if (std::find(runnable.begin(), runnable.end(), level) == runnable.end()) {
    state.SkipWithError("this CPU cannot run the level");
    return;
  }
  const void* stored = nullptr;
  if constexpr (T == DType::kF32) {
    stored = weights_f32().data();  // kN >= any N: its first N rows of kDotK values
  } else {
    stored = kPanels ? dot_panels<T>(n).data() : dot_weights<T>(n).data();
  }
  const ops::WeightMatrix b{
      stored, T, kDotK, n, ops::WeightLayout::kOutIn, 0, kPanels ? runtime::panel_outputs(n) : 0};
  std::vector<float> x(static_cast<std::size_t>(m * kDotK), 0.5f),
      y(static_cast<std::size_t>(m * n));
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  std::vector<std::uint16_t> bits(x.size());
  runtime::convert_f32_to_bf16(x, bits);
  std::vector<std::int8_t> codes(x.size());
  std::vector<float> scales(x.size() / 32);
  ops::quantize_activations_q8(m, kDotK, x.data(), kDotK, codes.data(), scales.data(), level);
  for (auto _ : state) {
    if constexpr (kTile) {
      ops::packed_gemm_q8(m, codes.data(), scales.data(), b, y.data(), n, level);
    } else if constexpr (T == DType::kF32) {
      ops::dot_gemm(m, x.data(), kDotK, b, y.data(), n, level);
    } else if constexpr (T == DType::kBF16) {
      ops::dot_gemm_bf16(m, bits.data(), kDotK, b, y.data(), n, level);
    } else {
      ops::dot_gemm_blocks(m, codes.data(), scales.data(), b, y.data(), n, level);
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["bytes_per_second"] = benchmark::Counter(
      static_cast<double>(n * row_bytes(T, kDotK)), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(to_string(T)) + ", " + std::string(runtime::to_string(level)) +
                 (kPanels ? ", panels" : "") + (kTile ? ", prefill tile" : ""));
}

void BM_Decode_QuantizeActivations(benchmark::State& state) {
  const std::int64_t m = state.range(0);
  const auto level = static_cast<runtime::KernelLevel>(state.range(1));
  const std::vector<runtime::KernelLevel> runnable = runtime::runnable_kernel_levels();
  if (std::find(runnable.begin(), runnable.end(), level) == runnable.end()) {
    state.SkipWithError("this CPU cannot run the level");
    return;
  }
  std::vector<float> x(static_cast<std::size_t>(m * kDotK), 0.5f);
  std::vector<std::int8_t> codes(x.size());
  std::vector<float> scales(x.size() / 32);
  for (auto _ : state) {
    ops::quantize_activations_q8(m, kDotK, x.data(), kDotK, codes.data(), scales.data(), level);
    benchmark::DoNotOptimize(codes.data());
  }
  state.SetLabel(std::string(runtime::to_string(level)));
}

// Decode attention's step: `heads` queries of one kv head (a GQA group) against a block of 256
// keys and values of 64 floats, rows 192 floats apart as a cache of 3 kv heads lays them out
// (the 109 M Llama's), in cache; kBits16: the rows stored as bf16 (a --kv-dtype bf16 cache).
// Reports keys per second.
template <bool kBits16>
void BM_Decode_KeyBlock(benchmark::State& state) {
  constexpr std::int64_t kKeys = 256, kD = 64, kStride = 192;
  const std::int64_t heads = state.range(0);
  const auto level = static_cast<runtime::KernelLevel>(state.range(1));
  const std::vector<runtime::KernelLevel> runnable = runtime::runnable_kernel_levels();
  if (std::find(runnable.begin(), runnable.end(), level) == runnable.end()) {
    state.SkipWithError("this CPU cannot run the level");
    return;
  }
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> k(kKeys * kStride), v(k.size()), q(heads * kD), scores(heads * kKeys),
      o(heads * kD);
  for (float& x : k) x = normal(rng);
  for (float& x : v) x = normal(rng);
  for (float& x : q) x = normal(rng);
  std::vector<std::uint16_t> k16(k.size()), v16(v.size());
  runtime::convert_f32_to_bf16(k, k16);
  runtime::convert_f32_to_bf16(v, v16);
  std::vector<const float*> keys, values;
  std::vector<const std::uint16_t*> keys16, values16;
  for (std::int64_t i = 0; i < kKeys; ++i) {
    keys.push_back(k.data() + i * kStride);
    values.push_back(v.data() + i * kStride);
    keys16.push_back(k16.data() + i * kStride);
    values16.push_back(v16.data() + i * kStride);
  }
  ops::KeyBlockStats stats[ops::kKeyBlockMaxHeads];
  for (auto _ : state) {
    if constexpr (kBits16) {
      ops::attend_key_block_heads(q.data(), kD, heads, keys16.data(), values16.data(), DType::kBF16,
                                  kKeys, kD, 0.125f, scores.data(), o.data(), kD, stats, level);
    } else {
      ops::attend_key_block_heads(q.data(), kD, heads, keys.data(), values.data(), kKeys, kD,
                                  0.125f, scores.data(), o.data(), kD, stats, level);
    }
    benchmark::DoNotOptimize(o.data());
  }
  state.counters["keys_per_second"] =
      benchmark::Counter(static_cast<double>(kKeys), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(kBits16 ? "bf16" : "f32") + " rows, " + std::to_string(heads) +
                 " heads, " + std::string(runtime::to_string(level)));
}

template <DType kKv>
void BM_Decode_Attention(benchmark::State& state) {
  const std::int64_t positions = state.range(0), d = state.range(1);
  const bool llama3 = d == 128;
  const std::int64_t layers = llama3 ? 4 : 12, kv_heads = llama3 ? 8 : 3, heads = llama3 ? 32 : 12;
  const std::int64_t elements = kv_heads * positions * d;
  const std::size_t bytes = static_cast<std::size_t>(elements) * dtype_size(kKv);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> row(static_cast<std::size_t>(elements));
  std::vector<std::vector<std::byte>> k(static_cast<std::size_t>(layers)),
      v(static_cast<std::size_t>(layers));
  for (std::int64_t l = 0; l < layers; ++l) {
    for (auto* cache : {&k[static_cast<std::size_t>(l)], &v[static_cast<std::size_t>(l)]}) {
      for (float& x : row) x = normal(rng);
      cache->resize(bytes);
      runtime::convert_elements(row.data(), DType::kF32, cache->data(), kKv, row.size());
    }
  }
  std::vector<float> q(static_cast<std::size_t>(heads * d)), out(q.size());
  for (float& x : q) x = 0.25f * normal(rng);
  const ops::AttentionSlice slice{.batch = 1,
                                  .q_len = 1,
                                  .kv_len = positions,
                                  .q_heads = heads,
                                  .kv_heads = kv_heads,
                                  .group = heads / kv_heads};
  const auto threads = static_cast<std::int64_t>(oneapi::tbb::this_task_arena::max_concurrency());
  std::vector<float> scratch(
      static_cast<std::size_t>(ops::attention_scratch_floats(slice, d, threads, kKv)));
  // Between layers, a layer's share of 60 MB read: what a q4_0 step of the model streams.
  std::vector<float> other(15 << 20, 1.0f);
  const std::size_t share = other.size() / static_cast<std::size_t>(layers);
  std::size_t at = 0;
  for (auto _ : state) {
    double seconds = 0;
    for (std::int64_t l = 0; l < layers; ++l) {
      const float read = oneapi::tbb::parallel_reduce(
          oneapi::tbb::blocked_range<std::size_t>(at, at + share), 0.0f,
          [&](const oneapi::tbb::blocked_range<std::size_t>& r, float acc) {
            for (std::size_t i = r.begin(); i < r.end(); i += 16) acc += other[i % other.size()];
            return acc;
          },
          [](float a, float b) { return a + b; });
      benchmark::DoNotOptimize(read);
      at = (at + share) % other.size();
      const ops::KvView kv{.k = k[static_cast<std::size_t>(l)].data(),
                           .v = v[static_cast<std::size_t>(l)].data(),
                           .batch_stride = elements,
                           .pos_stride = d,
                           .head_stride = positions * d,
                           .dtype = kKv};
      const auto t0 = std::chrono::steady_clock::now();
      ops::attention_core(q.data(), kv, out.data(), slice, d, positions - 1, true, scratch);
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    benchmark::DoNotOptimize(out.data());
    state.SetIterationTime(seconds);
  }
  state.counters["bytes_per_second"] = benchmark::Counter(
      static_cast<double>(2 * layers * bytes), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(to_string(kKv)) + " caches, " +
                 std::string(runtime::to_string(runtime::kernel_level())));
}

// Every level (0 scalar .. 4 amx) at M = 1 and 8, on N = 1024 and 8192.
void dot_args(benchmark::internal::Benchmark* b) {
  for (std::int64_t n : {1024, 8192}) {
    for (std::int64_t level = 0; level <= 4; ++level) {
      for (std::int64_t m : {1, 8, 16, 64}) b->Args({m, level, n});
    }
  }
}

BENCHMARK(BM_Decode_Dot<DType::kF32>)->Apply(dot_args)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decode_Dot<DType::kBF16>)->Apply(dot_args)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decode_Dot<DType::kQ8_0>)->Apply(dot_args)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decode_Dot<DType::kQ4_0>)->Apply(dot_args)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decode_Dot<DType::kQ8_0, true>)->Apply(dot_args)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decode_Dot<DType::kQ4_0, true>)->Apply(dot_args)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decode_Dot<DType::kQ8_0, true, true>)->Apply(dot_args)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decode_Dot<DType::kQ4_0, true, true>)->Apply(dot_args)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decode_Dot<DType::kQ4_K>)->Apply(dot_args)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decode_Dot<DType::kQ6_K>)->Apply(dot_args)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decode_KeyBlock<false>)
    ->ArgsProduct({{1, 4}, {0, 1, 2, 3, 4}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decode_KeyBlock<true>)
    ->ArgsProduct({{1, 4}, {0, 1, 2, 3, 4}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decode_Attention<DType::kF32>)
    ->ArgsProduct({{512, 2048}, {64, 128}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decode_Attention<DType::kBF16>)
    ->ArgsProduct({{512, 2048}, {64, 128}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decode_QuantizeActivations)
    ->ArgsProduct({{1, 8}, {0, 1, 2, 3}})
    ->Unit(benchmark::kMicrosecond);

BENCHMARK(BM_Decode_Read)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Decode_Gemv<DType::kF32>)
    ->Arg(1)
    ->Arg(4)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Decode_Gemv<DType::kBF16>)
    ->Arg(1)
    ->Arg(4)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Decode_Gemv<DType::kF16>)
    ->Arg(1)
    ->Arg(4)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Decode_DeviceGemm<DType::kF32>)
    ->Arg(1)
    ->Arg(4)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Decode_DeviceGemm<DType::kBF16>)
    ->Arg(1)
    ->Arg(4)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Decode_DeviceGemm<DType::kF16>)
    ->Arg(1)
    ->Arg(4)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Decode_OpenBlas)->Arg(1)->Arg(4)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace numesh::bench
