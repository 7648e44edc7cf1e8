// backward_check_main: the dense references' gradients (reference/backward.hpp) on random
// inputs, written for backward_check.py to recompute with PyTorch's autograd in float64:
//   DIR/{case}_{name}.npy   inputs and numesh's gradients
//   DIR/cases.json          per case its kind, eps, ids/targets and numesh's loss
//   backward_check_main DIR

#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "numesh/models/formats/npy.hpp"
#include "numesh/ops/reference/backward.hpp"

namespace rt = numesh::runtime;
namespace ops = numesh::ops;
namespace models = numesh::models;

namespace {

rt::HostTensor random_tensor(std::vector<std::int64_t> shape, std::uint32_t seed, float scale) {
  rt::HostTensor t = rt::HostTensor::zeros(std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  for (float& x : t.data) x = normal(rng);
  return t;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 2) {
    std::fprintf(stderr, "usage: backward_check_main DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  const auto save = [&](const std::string& c, const std::string& name, const rt::HostTensor& t) {
    models::save_npy(dir / (c + "_" + name + ".npy"), t);
  };
  nlohmann::json cases = nlohmann::json::array();
  {
    const rt::HostTensor x = random_tensor({5, 16}, 1, 1.0f), w = random_tensor({1, 16}, 2, 1.0f),
                         dy = random_tensor({5, 16}, 3, 1.0f);
    const ops::RmsNormGrads g = ops::rmsnorm_backward(x, w, dy, 1e-5);
    save("rmsnorm", "x", x), save("rmsnorm", "w", w), save("rmsnorm", "dy", dy);
    save("rmsnorm", "dx", g.dx), save("rmsnorm", "dw", g.dweight);
    cases.push_back({{"name", "rmsnorm"}, {"eps", 1e-5}});
  }
  {
    // LayerNorm, its rows offset by 3 (a mean far from 0, as activations have).
    rt::HostTensor x = random_tensor({5, 16}, 40, 1.0f);
    for (float& v : x.data) v += 3.0f;
    const rt::HostTensor w = random_tensor({1, 16}, 41, 1.0f),
                         dy = random_tensor({5, 16}, 42, 1.0f);
    const ops::LayerNormGrads g = ops::layernorm_backward(x, w, dy, 1e-5);
    save("layernorm", "x", x), save("layernorm", "w", w), save("layernorm", "dy", dy);
    save("layernorm", "dx", g.dx), save("layernorm", "dw", g.dweight),
        save("layernorm", "db", g.dbias);
    cases.push_back({{"name", "layernorm"}, {"eps", 1e-5}});
  }
  {
    const rt::HostTensor x = random_tensor({5, 16}, 4, 1.0f), w = random_tensor({16, 12}, 5, 0.3f),
                         dy = random_tensor({5, 12}, 6, 1.0f);
    const ops::LinearGrads g = ops::linear_backward(x, w, dy);
    save("linear", "x", x), save("linear", "w", w), save("linear", "dy", dy);
    save("linear", "dx", g.dx), save("linear", "dw", g.dw);
    cases.push_back({{"name", "linear"}});
  }
  {
    ops::MlpWeights w;
    w.gate = random_tensor({16, 24}, 7, 0.3f);
    w.up = random_tensor({16, 24}, 8, 0.3f);
    w.down = random_tensor({24, 16}, 9, 0.3f);
    const rt::HostTensor x = random_tensor({5, 16}, 10, 1.0f),
                         dy = random_tensor({5, 16}, 11, 1.0f);
    // The gated MLPs on the same weights: SwiGLU, and GeGLU (Gemma: gelu with tanh's
    // approximation on the gate).
    for (const auto& [name, kind] :
         {std::pair{"swiglu", ops::MlpKind::kSwiGLU}, std::pair{"geglu", ops::MlpKind::kGeGLU}}) {
      const ops::MlpGrads g = ops::mlp_backward(x, kind, w, dy);
      save(name, "x", x), save(name, "gate", w.gate), save(name, "up", w.up);
      save(name, "down", w.down), save(name, "dy", dy);
      save(name, "dx", g.dx), save(name, "dgate", g.dgate), save(name, "dup", g.dup);
      save(name, "ddown", g.ddown);
      cases.push_back({{"name", name}});
    }
    const ops::MlpGrads ge = ops::mlp_backward(x, ops::MlpKind::kGelu, w, dy);
    save("gelu", "x", x), save("gelu", "up", w.up), save("gelu", "down", w.down),
        save("gelu", "dy", dy);
    save("gelu", "dx", ge.dx), save("gelu", "dup", ge.dup), save("gelu", "ddown", ge.ddown);
    // With Llama's mlp_bias: biases on all three projections.
    w.gate_bias = random_tensor({24}, 12, 0.5f);
    w.up_bias = random_tensor({24}, 13, 0.5f);
    w.down_bias = random_tensor({16}, 14, 0.5f);
    const ops::MlpGrads gb = ops::mlp_backward(x, ops::MlpKind::kSwiGLU, w, dy);
    const std::string nb = "swiglu_bias";
    save(nb, "x", x), save(nb, "gate", w.gate), save(nb, "up", w.up), save(nb, "down", w.down),
        save(nb, "dy", dy);
    save(nb, "gate_bias", w.gate_bias), save(nb, "up_bias", w.up_bias),
        save(nb, "down_bias", w.down_bias);
    save(nb, "dx", gb.dx), save(nb, "dgate", gb.dgate), save(nb, "dup", gb.dup),
        save(nb, "ddown", gb.ddown);
    save(nb, "dgate_bias", gb.dgate_bias), save(nb, "dup_bias", gb.dup_bias),
        save(nb, "ddown_bias", gb.ddown_bias);
    cases.push_back({{"name", nb}});
    cases.push_back({{"name", "gelu"}});
  }
  {
    // Causal GQA attention with RoPE: 4 query heads over 2 kv heads, head_dim 8; once plain
    // (Llama), once with q, k, v and o biases and Qwen3's q/k norms.
    for (const bool extras : {false, true}) {
      const std::string n = extras ? "attention_bias_norm" : "attention";
      ops::AttentionConfig c;
      c.num_heads = 4;
      c.num_kv_heads = 2;
      c.head_dim = 8;
      c.rope_theta = 10000.0f;
      ops::AttentionWeights w;
      w.wq = random_tensor({16, 32}, 20, 0.3f);
      w.wk = random_tensor({16, 16}, 21, 0.3f);
      w.wv = random_tensor({16, 16}, 22, 0.3f);
      w.wo = random_tensor({32, 16}, 23, 0.3f);
      if (extras) {
        w.bq = random_tensor({32}, 26, 0.5f);
        w.bk = random_tensor({16}, 27, 0.5f);
        w.bv = random_tensor({16}, 28, 0.5f);
        w.bo = random_tensor({16}, 29, 0.5f);
        w.q_norm = random_tensor({8}, 36, 1.0f);
        w.k_norm = random_tensor({8}, 37, 1.0f);
      }
      const rt::HostTensor x = random_tensor({2, 5, 16}, 24, 1.0f),
                           dy = random_tensor({2, 5, 16}, 25, 1.0f);
      const ops::AttentionGrads g = ops::attention_layer_backward(x, w, c, dy);
      save(n, "x", x), save(n, "wq", w.wq), save(n, "wk", w.wk), save(n, "wv", w.wv),
          save(n, "wo", w.wo);
      save(n, "dy", dy), save(n, "dx", g.dx), save(n, "dwq", g.dwq), save(n, "dwk", g.dwk),
          save(n, "dwv", g.dwv);
      save(n, "dwo", g.dwo);
      if (extras) {
        save(n, "bq", w.bq), save(n, "bk", w.bk), save(n, "bv", w.bv), save(n, "bo", w.bo);
        save(n, "q_norm", w.q_norm), save(n, "k_norm", w.k_norm), save(n, "dbq", g.dbq),
            save(n, "dbk", g.dbk);
        save(n, "dbv", g.dbv), save(n, "dbo", g.dbo), save(n, "dq_norm", g.dq_norm),
            save(n, "dk_norm", g.dk_norm);
      }
      cases.push_back({{"name", n},
                       {"kind", "attention"},
                       {"heads", 4},
                       {"kv_heads", 2},
                       {"head_dim", 8},
                       {"theta", 10000.0},
                       {"extras", extras},
                       {"qk_norm_eps", c.qk_norm_eps}});
    }
  }
  {
    const std::vector<std::int32_t> ids{3, 0, 3, 9, 3, 7};  // repeats accumulate
    const rt::HostTensor dy = random_tensor({6, 8}, 12, 1.0f);
    save("embedding", "dy", dy), save("embedding", "dtable", ops::embedding_backward(ids, 10, dy));
    cases.push_back({{"name", "embedding"}, {"ids", ids}, {"vocab", 10}});
  }
  {
    const std::vector<std::int32_t> targets{0, 19, 4, 4, 11, 7};
    const rt::HostTensor x = random_tensor({6, 16}, 13, 1.0f),
                         w = random_tensor({16, 20}, 14, 0.5f);
    const ops::CrossEntropyGrads g = ops::lm_head_cross_entropy(x, w, targets);
    save("cross_entropy", "x", x), save("cross_entropy", "w", w);
    save("cross_entropy", "dx", g.dx), save("cross_entropy", "dw", g.dw);
    cases.push_back({{"name", "cross_entropy"}, {"targets", targets}, {"loss", g.loss}});
  }
  {
    // MoE: top-2 renormalised dropless (Mixtral), top-2 with capacity 0.75 (drops, so a
    // dropped choice still moves its token's renormalised weights), top-1 without
    // renormalisation and capacity 1; and Mixtral's with the router's load-balancing loss
    // (coefficient 0.5, large enough to move every gradient); and Qwen2-MoE's top-2 without
    // renormalisation plus a shared expert of 20 behind its sigmoid gate.
    struct MoeCase {
      const char* name;
      ops::MoeConfig config;
      double aux_coef = 0.0;
      bool shared = false;
    };
    for (const MoeCase& mc :
         {MoeCase{"moe_top2", {.num_experts = 4, .top_k = 2}},
          MoeCase{"moe_capacity", {.num_experts = 4, .top_k = 2, .capacity_factor = 0.75f}},
          MoeCase{"moe_top1",
                  {.num_experts = 4, .top_k = 1, .capacity_factor = 1.0f, .renormalize = false}},
          MoeCase{"moe_aux", {.num_experts = 4, .top_k = 2}, 0.5},
          MoeCase{"moe_shared", {.num_experts = 4, .top_k = 2, .renormalize = false}, 0.0, true}}) {
      ops::MoeWeights w;
      w.router = random_tensor({16, 4}, 30, 0.5f);
      w.gate = random_tensor({4, 16, 12}, 31, 0.3f);
      w.up = random_tensor({4, 16, 12}, 32, 0.3f);
      w.down = random_tensor({4, 12, 16}, 33, 0.3f);
      if (mc.shared) {
        w.shared_expert.gate = random_tensor({16, 20}, 36, 0.3f);
        w.shared_expert.up = random_tensor({16, 20}, 37, 0.3f);
        w.shared_expert.down = random_tensor({20, 16}, 38, 0.3f);
        w.shared_expert_gate = random_tensor({16, 1}, 39, 0.5f);
      }
      const rt::HostTensor x = random_tensor({10, 16}, 34, 1.0f),
                           dy = random_tensor({10, 16}, 35, 1.0f);
      std::vector<double> dprobs;
      double aux_loss = 0.0;
      if (mc.aux_coef > 0.0) {
        const ops::RouterAuxLoss aux = ops::router_aux_loss({x}, {w.router}, mc.config);
        aux_loss = aux.loss;
        for (const double d : aux.dprobs) dprobs.push_back(mc.aux_coef * d);
      }
      const ops::MoeGrads g = ops::moe_backward(x, w, mc.config, dy, dprobs);
      const std::string n = mc.name;
      save(n, "x", x), save(n, "router", w.router), save(n, "gate", w.gate), save(n, "up", w.up);
      save(n, "down", w.down), save(n, "dy", dy), save(n, "dx", g.dx),
          save(n, "drouter", g.drouter);
      save(n, "dgate", g.dgate), save(n, "dup", g.dup), save(n, "ddown", g.ddown);
      if (mc.shared) {
        save(n, "shared_gate", w.shared_expert.gate), save(n, "shared_up", w.shared_expert.up);
        save(n, "shared_down", w.shared_expert.down),
            save(n, "shared_expert_gate", w.shared_expert_gate);
        save(n, "dshared_gate", g.dshared_gate), save(n, "dshared_up", g.dshared_up);
        save(n, "dshared_down", g.dshared_down),
            save(n, "dshared_expert_gate", g.dshared_expert_gate);
      }
      cases.push_back({{"name", n},
                       {"kind", "moe"},
                       {"shared", mc.shared},
                       {"top_k", mc.config.top_k},
                       {"capacity_factor", mc.config.capacity_factor},
                       {"renormalize", mc.config.renormalize},
                       {"aux_coef", mc.aux_coef},
                       {"aux_loss", aux_loss}});
    }
  }
  std::ofstream(dir / "cases.json") << cases.dump(2);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "backward_check_main: %s\n", e.what());
  return 1;
}
