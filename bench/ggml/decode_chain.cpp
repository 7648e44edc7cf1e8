// decode_chain: llama.cpp's engine (ggml's CPU backend) running one decode step (batch 1) of a
// dense Llama-like stack with distinct weights per block, the baseline numesh's decode is held
// against per weight byte (docs/benchmarks.md, "Against llama.cpp's engine"). Built outside the
// project against a ggml checkout by run.sh; CI does not build it.
// Per block: h = rms_norm(x); q, k, v = Wq h, Wk h, Wv h; a = q + pad(k + v) (a stand-in for
// attention, negligible work); x += Wo a; h = rms_norm(x); x += Wd (silu(Wg h) * Wu h).
// Prints the median step time and the weights' GB/s (weight bytes / step time).
//   decode_chain f32|bf16|f16|q8_0|q4_0|q4_k|q6_k HIDDEN FFN KV_DIM LAYERS STEPS [THREADS]
// (the block formats quantized by ggml_quantize_chunk, GGML's reference quantizers: the bytes
// numesh's --dtype writes for the same weights)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

int main(int argc, char** argv) {
  if (argc < 7) {
    fprintf(stderr,
            "usage: %s dtype(f32|bf16|f16|q8_0|q4_0|q4_k|q6_k) hidden ffn kv_dim layers steps "
            "[threads]\n",
            argv[0]);
    return 1;
  }
  std::string ts = argv[1];
  ggml_type wt;
  if (ts == "f32") {
    wt = GGML_TYPE_F32;
  } else if (ts == "bf16") {
    wt = GGML_TYPE_BF16;
  } else if (ts == "f16") {
    wt = GGML_TYPE_F16;
  } else if (ts == "q8_0") {
    wt = GGML_TYPE_Q8_0;
  } else if (ts == "q4_0") {
    wt = GGML_TYPE_Q4_0;
  } else if (ts == "q4_k") {
    wt = GGML_TYPE_Q4_K;
  } else if (ts == "q6_k") {
    wt = GGML_TYPE_Q6_K;
  } else {
    fprintf(stderr, "decode_chain: unknown dtype '%s'\n", ts.c_str());
    return 1;
  }
  const int64_t H = atoll(argv[2]), F = atoll(argv[3]), KV = atoll(argv[4]);
  const int L = atoi(argv[5]), steps = atoi(argv[6]);
  const int nth = argc > 7 ? atoi(argv[7]) : 2;

  ggml_backend_t be = ggml_backend_cpu_init();
  ggml_backend_cpu_set_n_threads(be, nth);

  // weights
  ggml_init_params wp = {ggml_tensor_overhead() * (8 * L + 8), nullptr, true};
  ggml_context* wctx = ggml_init(wp);
  struct Blk {
    ggml_tensor *q, *k, *v, *o, *g, *u, *d;
  };
  std::vector<Blk> blk(L);
  for (auto& b : blk) {
    b.q = ggml_new_tensor_2d(wctx, wt, H, H);
    b.k = ggml_new_tensor_2d(wctx, wt, H, KV);
    b.v = ggml_new_tensor_2d(wctx, wt, H, KV);
    b.o = ggml_new_tensor_2d(wctx, wt, H, H);
    b.g = ggml_new_tensor_2d(wctx, wt, H, F);
    b.u = ggml_new_tensor_2d(wctx, wt, H, F);
    b.d = ggml_new_tensor_2d(wctx, wt, F, H);
  }
  ggml_tensor* x0 = ggml_new_tensor_1d(wctx, GGML_TYPE_F32, H);
  ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors(wctx, be);
  ggml_backend_buffer_set_usage(wbuf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);

  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  size_t wbytes = 0;
  {
    std::vector<float> f;
    std::vector<char> q;
    for (ggml_tensor* t = ggml_get_first_tensor(wctx); t; t = ggml_get_next_tensor(wctx, t)) {
      const int64_t n = ggml_nelements(t);
      f.resize(n);
      const float s = 1.0f / std::sqrt((float)t->ne[0]);
      for (auto& e : f) e = dist(rng) * s;
      if (t->type == GGML_TYPE_F32) {
        ggml_backend_tensor_set(t, f.data(), 0, ggml_nbytes(t));
      } else {
        q.resize(ggml_nbytes(t));
        ggml_quantize_chunk(t->type, f.data(), q.data(), 0, t->ne[1], t->ne[0], nullptr);
        ggml_backend_tensor_set(t, q.data(), 0, ggml_nbytes(t));
      }
      if (t != x0) wbytes += ggml_nbytes(t);
    }
  }

  // graph
  ggml_init_params gp = {
      ggml_tensor_overhead() * (40 * L + 16) + ggml_graph_overhead_custom(40 * L + 16, false),
      nullptr, true};
  ggml_context* gctx = ggml_init(gp);
  ggml_tensor* x = x0;
  for (auto& b : blk) {
    ggml_tensor* h = ggml_rms_norm(gctx, x, 1e-5f);
    ggml_tensor* q = ggml_mul_mat(gctx, b.q, h);
    ggml_tensor* kv = ggml_add(gctx, ggml_mul_mat(gctx, b.k, h), ggml_mul_mat(gctx, b.v, h));
    ggml_tensor* a = ggml_add(gctx, q, ggml_pad(gctx, kv, H - KV, 0, 0, 0));
    x = ggml_add(gctx, x, ggml_mul_mat(gctx, b.o, a));
    h = ggml_rms_norm(gctx, x, 1e-5f);
    ggml_tensor* m =
        ggml_mul(gctx, ggml_silu(gctx, ggml_mul_mat(gctx, b.g, h)), ggml_mul_mat(gctx, b.u, h));
    x = ggml_add(gctx, x, ggml_mul_mat(gctx, b.d, m));
  }
  ggml_cgraph* gf = ggml_new_graph_custom(gctx, 40 * L + 16, false);
  ggml_build_forward_expand(gf, x);
  ggml_gallocr_t ga = ggml_gallocr_new(ggml_backend_get_default_buffer_type(be));
  ggml_gallocr_alloc_graph(ga, gf);

  for (int i = 0; i < 3; i++) ggml_backend_graph_compute(be, gf);  // warmup
  std::vector<double> ms;
  for (int i = 0; i < steps; i++) {
    auto t0 = std::chrono::steady_clock::now();
    ggml_backend_graph_compute(be, gf);
    auto t1 = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::vector<float> out(H);
  ggml_backend_tensor_get(x, out.data(), 0, H * sizeof(float));
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  printf(
      "ggml-chain dtype=%s H=%lld F=%lld KV=%lld L=%d threads=%d nodes=%d weightMB=%.1f "
      "median_ms=%.3f min_ms=%.3f GB/s=%.2f (out[0]=%g)\n",
      ts.c_str(), (long long)H, (long long)F, (long long)KV, L, nth, ggml_graph_n_nodes(gf),
      wbytes / 1e6, med, ms[0], wbytes / 1e9 / (med / 1e3), out[0]);
  ggml_gallocr_free(ga);
  ggml_free(gctx);
  ggml_backend_buffer_free(wbuf);
  ggml_free(wctx);
  ggml_backend_free(be);
  return 0;
}
