// The attention and MoE layers at the shapes of bench/attention_torch.py and bench/moe_torch.py
// (their defaults), numesh's sharded operators on the benchmark devices (bench_devices.hpp: one
// per core on a one-node machine, so 2 here) beside the dense single-thread path (the same
// kernels: ops::gemm, attention_kernel / attention_core, moe_reference, on the calling thread),
// measured in the same run; PyTorch's figures come from the two scripts.
//   build/bench/bench/ops_bench
//
// Attention: hidden 1024, 16 query heads, 4 kv heads (GQA), head_dim 64, causal, RoPE theta
// 10000, fp32, batch 1, heads split over tp. The sharded layer keeps a KV cache.
//   Prefill: x [1, 1024, 1024] at position 0; the timed loop is forward(x, 0), which includes
//     the program's load and store nodes staging x in and y out (4 MiB each).
//   Decode: the cache prefilled with 1024 tokens once, then forward(x1, 1024) with x1
//     [1, 1, 1024] (the same slot is rewritten every iteration), 1025 keys per query.
// Counters: GFLOP/s from ops::attention_flops, which counts the causal keys only (token t sees
// t + 1 keys: T(T+1)/2 score entries in prefill); attention_torch.py counts the full T x T
// score matrix although the mask discards half of it, so prefill also reports torch_GFLOP/s with
// that full count (7.52 vs 9.66 GFLOP per forward): compare torch_GFLOP/s with the script's
// prefill figure. In decode both counts agree (one query over 1025 keys). Decode also reports
// GB/s as the script does: the four weight matrices plus the k and v caches (1025 positions x
// 4 kv heads x 64 x 4 bytes each), each read once per step.
//
// MoE: T 512, H 1024, F 1024 per expert, 8 experts, top-2, dropless, renormalised, weights
// scaled 0.02 as in moe_torch.py. Sharded over {"ep"} (experts split) and {"tp"} (each expert's
// F split); the timed loop is forward(x) (scatter, graph, gather). The label lists the kept
// assignments per expert of the last forward (the ep split's balance depends on it).
// Counters: GFLOP/s (2*T*H*E + 3*2*H*F*T*k, the script's count) and tokens/s.

#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <random>
#include <span>
#include <vector>

#include "bench_devices.hpp"
#include "numesh/ops/kernels/attention_core.hpp"
#include "numesh/ops/kernels/gemm.hpp"
#include "numesh/ops/kernels/rope.hpp"
#include "numesh/ops/lowering/attention.hpp"
#include "numesh/ops/lowering/moe.hpp"
#include "numesh/ops/reference/moe.hpp"

namespace numesh::bench {
namespace {

// ---- Attention --------------------------------------------------------------------------------

constexpr std::int64_t kHidden = 1024, kHeads = 16, kKvHeads = 4, kHeadDim = 64, kSeq = 1024;
constexpr std::int64_t kQDim = kHeads * kHeadDim, kKvDim = kKvHeads * kHeadDim;

constexpr ops::AttentionConfig kAttention{.num_heads = kHeads,
                                          .num_kv_heads = kKvHeads,
                                          .head_dim = kHeadDim,
                                          .causal = true,
                                          .q_offset = 0,
                                          .rope_theta = 10000.0f};

// attention_torch.py's flops(): projections plus QK^T and PV over the full t x s score matrix.
constexpr double torch_attention_flops(std::int64_t t, std::int64_t s) {
  const double projections = 2.0 * static_cast<double>(t) * static_cast<double>(kHidden) *
                             static_cast<double>(kHeadDim) *
                             static_cast<double>(2 * kHeads + 2 * kKvHeads);
  return projections + 2.0 * 2.0 * static_cast<double>(kHeads) * static_cast<double>(t) *
                           static_cast<double>(s) * static_cast<double>(kHeadDim);
}

// Decode traffic as attention_torch.py counts it: the weights plus the k and v caches of
// kSeq + 1 positions, read once.
constexpr double kDecodeBytes =
    4.0 * static_cast<double>(kHidden * kQDim + 2 * kHidden * kKvDim + kQDim * kHidden) +
    2.0 * 4.0 * static_cast<double>((kSeq + 1) * kKvDim);

runtime::HostTensor random(std::vector<std::int64_t> shape, std::uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  runtime::HostTensor t = runtime::HostTensor::zeros(std::move(shape));
  for (float& v : t.data) v = normal(rng);
  return t;
}

// `t`'s values as a [rows, cols] matrix (rank 2, or a [1, rows, cols] activation).
ops::RowMatrix matrix(const runtime::HostTensor& t, std::int64_t rows, std::int64_t cols) {
  return Eigen::Map<const ops::RowMatrix>(t.data.data(), rows, cols);
}

ops::ConstMatrixMap cmap(const ops::RowMatrix& m) { return {m.data(), m.rows(), m.cols()}; }
ops::MatrixMap map(ops::RowMatrix& m) { return {m.data(), m.rows(), m.cols()}; }

ops::AttentionWeights attention_weights() {
  ops::AttentionWeights w;
  w.wq = random({kHidden, kQDim}, 11, 0.02f);
  w.wk = random({kHidden, kKvDim}, 12, 0.02f);
  w.wv = random({kHidden, kKvDim}, 13, 0.02f);
  w.wo = random({kQDim, kHidden}, 14, 0.02f);
  return w;
}

runtime::HostTensor prefill_input() { return random({1, kSeq, kHidden}, 15, 1.0f); }
runtime::HostTensor decode_input() { return random({1, 1, kHidden}, 16, 1.0f); }

ops::AttentionSlice attention_slice(std::int64_t q_len, std::int64_t kv_len) {
  return {.batch = 1,
          .q_len = q_len,
          .kv_len = kv_len,
          .q_heads = kHeads,
          .kv_heads = kKvHeads,
          .group = kHeads / kKvHeads,
          .q_head_offset = 0,
          .kv_head_offset = 0};
}

void set_prefill_counters(benchmark::State& state) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(ops::attention_flops(kAttention, kHidden, 1, kSeq, 0) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
  state.counters["torch_GFLOP/s"] = benchmark::Counter(
      torch_attention_flops(kSeq, kSeq) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void set_decode_counters(benchmark::State& state) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(ops::attention_flops(kAttention, kHidden, 1, 1, kSeq) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GB/s"] =
      benchmark::Counter(kDecodeBytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Attention_Prefill_Sharded(benchmark::State& state) {
  const auto mesh = runtime::DeviceMesh::create(bench_devices(), {-1}, {"tp"});
  ops::ShardedAttention layer(mesh, kAttention, attention_weights(), 1, kSeq);
  const runtime::HostTensor x = prefill_input();
  layer.forward(x, 0);  // compiles the T = 1024 program outside the loop
  for (auto _ : state) {
    runtime::HostTensor y = layer.forward(x, 0);
    benchmark::DoNotOptimize(y.data.data());
  }
  set_prefill_counters(state);
}

void BM_Attention_Decode_Sharded(benchmark::State& state) {
  const auto mesh = runtime::DeviceMesh::create(bench_devices(), {-1}, {"tp"});
  ops::ShardedAttention layer(mesh, kAttention, attention_weights(), 1, kSeq + 1);
  layer.forward(prefill_input(), 0);  // fills cache positions [0, 1024)
  const runtime::HostTensor x1 = decode_input();
  layer.forward(x1, kSeq);  // compiles the T = 1 program outside the loop
  for (auto _ : state) {
    runtime::HostTensor y = layer.forward(x1, kSeq);
    benchmark::DoNotOptimize(y.data.data());
  }
  set_decode_counters(state);
}

// The same layer on the calling thread: ops::gemm projections, attention_kernel (RoPE and the
// causal core numesh's devices run), the output projection.
void BM_Attention_Prefill_Reference(benchmark::State& state) {
  const ops::AttentionWeights w = attention_weights();
  const ops::RowMatrix wq = matrix(w.wq, kHidden, kQDim), wk = matrix(w.wk, kHidden, kKvDim),
                       wv = matrix(w.wv, kHidden, kKvDim), wo = matrix(w.wo, kQDim, kHidden);
  const ops::RowMatrix x = matrix(prefill_input(), kSeq, kHidden);
  ops::RowMatrix q(kSeq, kQDim), k(kSeq, kKvDim), v(kSeq, kKvDim), o(kSeq, kQDim), y(kSeq, kHidden);
  std::vector<float> scores(static_cast<std::size_t>(kSeq));
  const ops::AttentionSlice slice = attention_slice(kSeq, kSeq);
  for (auto _ : state) {
    ops::gemm(cmap(x), cmap(wq), map(q));
    ops::gemm(cmap(x), cmap(wk), map(k));
    ops::gemm(cmap(x), cmap(wv), map(v));
    ops::attention_kernel(q.data(), k.data(), v.data(), o.data(), slice, kAttention, scores);
    ops::gemm(cmap(o), cmap(wo), map(y));
    benchmark::DoNotOptimize(y.data());
  }
  set_prefill_counters(state);
}

// One token against a bthd cache of 1025 positions on the calling thread: the projections, RoPE
// at position 1024, the cache write and attention_core over the 1025 keys (what a device's
// decode node does), the output projection.
void BM_Attention_Decode_Reference(benchmark::State& state) {
  const ops::AttentionWeights w = attention_weights();
  const ops::RowMatrix wq = matrix(w.wq, kHidden, kQDim), wk = matrix(w.wk, kHidden, kKvDim),
                       wv = matrix(w.wv, kHidden, kKvDim), wo = matrix(w.wo, kQDim, kHidden);
  constexpr std::int64_t kLen = kSeq + 1;
  ops::RowMatrix cache_k(kLen, kKvDim), cache_v(kLen, kKvDim);
  {  // Prefill the cache: positions [0, 1024) hold the prompt's roped keys and its values.
    const ops::RowMatrix x = matrix(prefill_input(), kSeq, kHidden);
    ops::gemm(cmap(x), cmap(wk), ops::MatrixMap(cache_k.data(), kSeq, kKvDim));
    ops::gemm(cmap(x), cmap(wv), ops::MatrixMap(cache_v.data(), kSeq, kKvDim));
    ops::rope_inplace(cache_k.data(), 1, kSeq, kKvHeads, kHeadDim, 0, kAttention.rope_theta);
  }
  const ops::RowMatrix x1 = matrix(decode_input(), 1, kHidden);
  ops::RowMatrix q(1, kQDim), k(1, kKvDim), v(1, kKvDim), o(1, kQDim), y(1, kHidden);
  const ops::AttentionSlice slice = attention_slice(1, kLen);
  // Scratch for every slot of the arena the benchmark runs in (attention_core is parallel).
  std::vector<float> scores(static_cast<std::size_t>(ops::attention_scratch_floats(
      slice, kHeadDim, oneapi::tbb::this_task_arena::max_concurrency())));
  const ops::KvView kv{.k = cache_k.data(),
                       .v = cache_v.data(),
                       .batch_stride = kLen * kKvDim,
                       .pos_stride = kKvDim,
                       .head_stride = kHeadDim};
  for (auto _ : state) {
    ops::gemm(cmap(x1), cmap(wq), map(q));
    ops::gemm(cmap(x1), cmap(wk), map(k));
    ops::gemm(cmap(x1), cmap(wv), map(v));
    ops::rope_inplace(q.data(), 1, 1, kHeads, kHeadDim, kSeq, kAttention.rope_theta);
    ops::rope_inplace(k.data(), 1, 1, kKvHeads, kHeadDim, kSeq, kAttention.rope_theta);
    cache_k.row(kSeq) = k.row(0);
    cache_v.row(kSeq) = v.row(0);
    ops::attention_core(q.data(), kv, o.data(), slice, kHeadDim, kSeq, true, scores);
    ops::gemm(cmap(o), cmap(wo), map(y));
    benchmark::DoNotOptimize(y.data());
  }
  set_decode_counters(state);
}

// ---- MoE --------------------------------------------------------------------------------------

constexpr std::int64_t kTokens = 512, kFfn = 1024, kExperts = 8, kTopK = 2;
constexpr double kMoeFlops =
    2.0 * kTokens * kHidden * kExperts + 3.0 * 2.0 * kHidden * kFfn * kTokens * kTopK;

constexpr ops::MoeConfig kMoe{
    .num_experts = kExperts, .top_k = kTopK, .capacity_factor = 0.0f, .renormalize = true};

ops::MoeWeights moe_weights() {
  ops::MoeWeights w;
  w.router = random({kHidden, kExperts}, 21, 0.02f);
  w.gate = random({kExperts, kHidden, kFfn}, 22, 0.02f);
  w.up = random({kExperts, kHidden, kFfn}, 23, 0.02f);
  w.down = random({kExperts, kFfn, kHidden}, 24, 0.02f);
  return w;
}

runtime::HostTensor moe_input() { return random({kTokens, kHidden}, 25, 1.0f); }

void set_moe_counters(benchmark::State& state) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(kMoeFlops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(kTokens),
                                                  benchmark::Counter::kIsIterationInvariantRate);
}

void run_sharded_moe(benchmark::State& state, const char* axis, ops::MoeAxes axes = {}) {
  const auto mesh = runtime::DeviceMesh::create(bench_devices(), {-1}, {axis});
  ops::ShardedMoe moe(mesh, kMoe, moe_weights(), kTokens, std::move(axes));
  const runtime::HostTensor x = moe_input();
  for (auto _ : state) {
    runtime::HostTensor y = moe.forward(x);
    benchmark::DoNotOptimize(y.data.data());
  }
  state.SetLabel(fmt::format("tokens/expert {}", fmt::join(moe.stats().tokens_per_expert, ",")));
  set_moe_counters(state);
}

void BM_Moe_Sharded(benchmark::State& state) { run_sharded_moe(state, "ep"); }
void BM_Moe_ShardedTp(benchmark::State& state) { run_sharded_moe(state, "tp"); }
// Tokens split over ep as well: each device routes its half, GShard's all-to-all dispatch and
// combine (the label sums the two routing groups' counts).
void BM_Moe_ShardedAllToAll(benchmark::State& state) {
  run_sharded_moe(state, "ep", ops::MoeAxes{.batch = {"ep"}});
}

void BM_Moe_Reference(benchmark::State& state) {
  const ops::MoeWeights w = moe_weights();
  const ops::RowMatrix x = matrix(moe_input(), kTokens, kHidden);
  for (auto _ : state) {
    ops::RowMatrix y = ops::moe_reference(x, w, kMoe);
    benchmark::DoNotOptimize(y.data());
  }
  set_moe_counters(state);
}

BENCHMARK(BM_Attention_Prefill_Sharded)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Attention_Prefill_Reference)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Attention_Decode_Sharded)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Attention_Decode_Reference)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Moe_Sharded)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Moe_ShardedAllToAll)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Moe_ShardedTp)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Moe_Reference)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace numesh::bench
