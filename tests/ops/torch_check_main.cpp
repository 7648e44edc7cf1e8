// torch_check_main: writes seeded inputs and numesh's dense-reference outputs as .npy files
// into a folder, for tests/ops/torch_check.py to recompute with PyTorch and compare.
//   torch_check_main DIR
// Cases: mlp_gelu, mlp_swiglu, rmsnorm, and attention (MHA causal prefill with RoPE, GQA,
// decode of one token against 7 cached keys), each on small shapes (file names in
// torch_check.py).

#include <cstdio>
#include <filesystem>
#include <random>
#include <string>

#include "numesh/core/error.hpp"
#include "numesh/ops/npy.hpp"
#include "numesh/ops/reference.hpp"

namespace {

using numesh::ops::RowMatrix;
using numesh::runtime::HostTensor;

RowMatrix random_matrix(Eigen::Index rows, Eigen::Index cols, std::mt19937& rng, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  RowMatrix m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = normal(rng);
  return m;
}

HostTensor host(const RowMatrix& m) {
  HostTensor t = HostTensor::zeros({m.rows(), m.cols()});
  std::copy(m.data(), m.data() + m.size(), t.data.begin());
  return t;
}

void save(const std::filesystem::path& dir, const std::string& name, const RowMatrix& m) {
  numesh::ops::save_npy(dir / (name + ".npy"), host(m));
}

HostTensor random_tensor(std::vector<std::int64_t> shape, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  HostTensor t = HostTensor::zeros(std::move(shape));
  for (float& v : t.data) v = normal(rng);
  return t;
}

// One attention case: q [B, T, hq, D], k and v [B, S, hkv, D], written with numesh's output.
void attention_case(const std::filesystem::path& dir, const std::string& name, std::int64_t t,
                    std::int64_t s, std::int64_t hq, std::int64_t hkv, std::int64_t q_offset,
                    std::mt19937& rng) {
  const std::int64_t b = 2, d = 8;
  const HostTensor q = random_tensor({b, t, hq, d}, rng);
  const HostTensor k = random_tensor({b, s, hkv, d}, rng);
  const HostTensor v = random_tensor({b, s, hkv, d}, rng);
  numesh::ops::AttentionConfig config;
  config.num_heads = hq;
  config.num_kv_heads = hkv;
  config.head_dim = d;
  config.q_offset = q_offset;
  numesh::ops::save_npy(dir / (name + "_q.npy"), q);
  numesh::ops::save_npy(dir / (name + "_k.npy"), k);
  numesh::ops::save_npy(dir / (name + "_v.npy"), v);
  numesh::ops::save_npy(dir / (name + "_out.npy"), numesh::ops::attention_reference(q, k, v, config));
}

// One MoE case on 12 tokens, hidden 16, 6 experts of intermediate 24.
void moe_case(const std::filesystem::path& dir, const std::string& name, std::int64_t k,
              float capacity_factor, bool renormalize, std::mt19937& rng) {
  const std::int64_t t = 12, h = 16, f = 24, e = 6;
  const RowMatrix x = random_matrix(t, h, rng, 1.0f);
  numesh::ops::MoeWeights w;
  w.router = random_tensor({h, e}, rng);
  w.gate = random_tensor({e, h, f}, rng);
  w.up = random_tensor({e, h, f}, rng);
  w.down = random_tensor({e, f, h}, rng);
  for (auto* m : {&w.gate, &w.up, &w.down}) {
    for (float& v : m->data) v *= 0.2f;
  }
  numesh::ops::MoeStats stats;
  const RowMatrix y = numesh::ops::moe_reference(
      x, w, {.num_experts = e, .top_k = k, .capacity_factor = capacity_factor, .renormalize = renormalize},
      &stats);
  save(dir, name + "_x", x);
  numesh::ops::save_npy(dir / (name + "_router.npy"), w.router);
  numesh::ops::save_npy(dir / (name + "_gate.npy"), w.gate);
  numesh::ops::save_npy(dir / (name + "_up.npy"), w.up);
  numesh::ops::save_npy(dir / (name + "_down.npy"), w.down);
  save(dir, name + "_out", y);
  RowMatrix counts(1, e);
  for (std::int64_t i = 0; i < e; ++i) counts(0, i) = static_cast<float>(stats.tokens_per_expert[static_cast<std::size_t>(i)]);
  save(dir, name + "_tokens_per_expert", counts);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: torch_check_main DIR\n");
    return 2;
  }
  try {
    const std::filesystem::path dir = argv[1];
    std::filesystem::create_directories(dir);
    std::mt19937 rng(1234);
    const Eigen::Index t = 7, h = 32, f = 88;
    const RowMatrix x = random_matrix(t, h, rng, 1.0f);
    const RowMatrix w1 = random_matrix(h, f, rng, 0.2f), w2 = random_matrix(f, h, rng, 0.2f);
    const RowMatrix wg = random_matrix(h, f, rng, 0.2f), wu = random_matrix(h, f, rng, 0.2f),
                    wd = random_matrix(f, h, rng, 0.2f);
    const RowMatrix norm_w = random_matrix(1, h, rng, 1.0f);
    save(dir, "x", x);
    save(dir, "w1", w1);
    save(dir, "w2", w2);
    save(dir, "w_gate", wg);
    save(dir, "w_up", wu);
    save(dir, "w_down", wd);
    save(dir, "norm_weight", norm_w);
    save(dir, "mlp_gelu_out", numesh::ops::mlp_gelu_reference(x, w1, w2));
    save(dir, "mlp_swiglu_out", numesh::ops::mlp_swiglu_reference(x, wg, wu, wd));
    save(dir, "rmsnorm_out", numesh::ops::rmsnorm_reference(x, norm_w, 1e-6f));
    attention_case(dir, "mha_prefill", 5, 5, 4, 4, 0, rng);
    attention_case(dir, "gqa_prefill", 6, 6, 4, 2, 0, rng);
    attention_case(dir, "gqa_decode", 1, 7, 4, 2, 6, rng);
    moe_case(dir, "moe_top2_dropless", 2, 0.0f, true, rng);
    moe_case(dir, "moe_top1_capacity", 1, 1.0f, true, rng);
    moe_case(dir, "moe_top3_raw", 3, 0.0f, false, rng);
    return 0;
  } catch (const numesh::Error& e) {
    std::fprintf(stderr, "torch_check_main: %s\n", e.what());
    return 1;
  }
}
