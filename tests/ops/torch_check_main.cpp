// torch_check_main: writes seeded inputs, numesh's outputs and a manifest into a folder, for
// tests/ops/torch_check.py to recompute every case with PyTorch in float64 and compare.
//   torch_check_main DIR [SEED]
//
// DIR/cases.json lists the cases: for each, the op PyTorch recomputes, its parameters, the
// calls (token count and position of each step for layers with a KV cache), the input files
// (DIR/<case>_<tensor>.npy) and the outputs numesh produced (one file per implementation and
// step, each with the tolerance class it is judged by; the bounds live in torch_check.py).
// The cases, by op (docs/ops.md, "Checked against PyTorch", has the table):
//   mlp_gelu, mlp_swiglu, mlp_geglu  the references on a small shape, and at T=64, H=256, F=512 the
//                         references and ShardedMlp on tp1, tp2 (whose GEMMs are large enough
//                         for gemm() to send them to OpenBLAS); the same with bf16 and f16
//                         weights, and at T=3, F=1024 (the decode kernels); bf16 ones also
//                         against PyTorch's own MLP in torch.bfloat16
//   rmsnorm               the reference
//   attention             attention_reference on q, k, v: MHA, GQA, MQA; RoPE 10000, 500000
//                         and off; causal and not; decode and inserts at positions 3000-4000
//   attention_layer       ShardedAttention on tp1 and tp2 (with the cache: prefill, inserts,
//                         decode steps; and without: train) against the layer in torch: the
//                         blocked GEMM path (>= 16 queries, whole and partial 64-query
//                         blocks) and the one-query path (< 16 queries), up to 3100
//                         cached positions; MHA, GQA, MQA; RoPE 10000, 500000, off; causal
//                         and not
//   moe                   moe_reference (top-k, renormalised or not, dropless or capacity),
//                         and its routing statistics
//   transformer           one block (attention + SwiGLU MLP or MoE, RMSNorms, residuals, with
//                         and without the final norm): TransformerReference and
//                         ShardedTransformer on tp1, tp2 (and ep2 for MoE): prefill, an
//                         insert and a decode step through the KV cache; and the MoE
//                         routing statistics; the dense block with bf16 and f16 weights, the
//                         MoE block with f16 experts
//   lm_head               lm_head_reference and ShardedLmHead on tp1, tp2 (vocabulary-
//                         parallel): logits, and greedy ids against torch.argmax

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "../runtime/test_devices.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"
#include "numesh/models/formats/npy.hpp"
#include "numesh/ops/lowering/attention.hpp"
#include "numesh/ops/lowering/lm_head.hpp"
#include "numesh/ops/lowering/mlp.hpp"
#include "numesh/ops/lowering/transformer.hpp"
#include "numesh/ops/reference/attention.hpp"
#include "numesh/ops/reference/lm_head.hpp"
#include "numesh/ops/reference/mlp.hpp"
#include "numesh/ops/reference/moe.hpp"
#include "numesh/ops/reference/norms.hpp"
#include "numesh/ops/reference/transformer.hpp"

namespace {

namespace fs = std::filesystem;
namespace ops = numesh::ops;
namespace models = numesh::models;
namespace rt = numesh::runtime;
using nlohmann::json;
using numesh::ops::RowMatrix;
using numesh::runtime::HostTensor;

// ---------------------------------------------------------------------------------------------
// Tensors.

HostTensor random_tensor(std::vector<std::int64_t> shape, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  HostTensor t = HostTensor::zeros(std::move(shape));
  for (float& v : t.data) v = normal(rng);
  return t;
}

HostTensor to_host(const RowMatrix& m) {
  HostTensor t = HostTensor::zeros({m.rows(), m.cols()});
  std::copy(m.data(), m.data() + m.size(), t.data.begin());
  return t;
}

RowMatrix to_matrix(const HostTensor& t) {
  const std::int64_t cols = t.shape.back();
  const auto rows = static_cast<std::int64_t>(t.data.size()) / cols;
  return Eigen::Map<const RowMatrix>(t.data.data(), rows, cols);
}

// A 1-row count vector, for routing statistics.
HostTensor counts(const std::vector<std::int64_t>& values) {
  HostTensor t = HostTensor::zeros({1, static_cast<std::int64_t>(values.size())});
  for (std::size_t i = 0; i < values.size(); ++i) t.data[i] = static_cast<float>(values[i]);
  return t;
}

// ---------------------------------------------------------------------------------------------
// Meshes: one NUMA node and one thread per device (synthetic, unpinned), as the ops tests use.

rt::DeviceMesh mesh(std::int64_t n, const std::string& axis) {
  return rt::DeviceMesh::create(
      rt::testing::synthetic_devices(rt::testing::nodes(static_cast<int>(n))), {n}, {axis});
}

struct MeshChoice {
  std::string label;  // "tp2": names the implementation in the report
  std::int64_t size;
  std::string axis;
};

const MeshChoice kTp1{"tp1", 1, "tp"};
const MeshChoice kTp2{"tp2", 2, "tp"};
const MeshChoice kEp2{"ep2", 2, "ep"};

// ---------------------------------------------------------------------------------------------
// The manifest.

// One case: what torch_check.py recomputes and which numesh outputs it compares.
struct Case {
  std::string name;
  json entry;
};

class Writer {
 public:
  explicit Writer(fs::path dir) : dir_(std::move(dir)) {}

  Case begin(const std::string& name, const std::string& op, json params = json::object()) {
    return Case{name, json{{"name", name},
                           {"op", op},
                           {"params", std::move(params)},
                           {"steps", json::array()},
                           {"inputs", json::array()},
                           {"outputs", json::array()}}};
  }
  // A call of a layer with a KV cache (or the one call of a train/reference case).
  static void step(Case& c, std::int64_t position, std::int64_t tokens) {
    c.entry["steps"].push_back({{"position", position}, {"tokens", tokens}});
  }
  void input(Case& c, const std::string& tensor, const HostTensor& t) {
    models::save_npy(dir_ / (c.name + "_" + tensor + ".npy"), t);
    c.entry["inputs"].push_back(tensor);
  }
  // numesh's result of `impl` at step `step`; `quantity` is "y" (the output) or
  // "tokens_per_expert"; `check` names the tolerance class (torch_check.py's BOUNDS);
  // `against` what torch computes: "float64" (the op in float64, weights rounded to the case's
  // dtype as numesh stores them) or "torch_bf16" (PyTorch's own layer in torch.bfloat16).
  void output(Case& c, const std::string& impl, std::int64_t step, const std::string& check,
              const HostTensor& t, const std::string& quantity = "y",
              const std::string& against = "float64") {
    std::string file = c.name + "_" + impl + "_" + quantity + "_step" + std::to_string(step);
    if (against != "float64") file += "_vs_" + against;
    std::replace(file.begin(), file.end(), ' ', '_');
    models::save_npy(dir_ / (file + ".npy"), t);
    c.entry["outputs"].push_back({{"file", file},
                                  {"impl", impl},
                                  {"step", step},
                                  {"check", check},
                                  {"quantity", quantity},
                                  {"against", against}});
  }
  void add(Case c) { cases_.push_back(std::move(c.entry)); }
  void finish() const {
    std::ofstream out(dir_ / "cases.json");
    out << json{{"cases", cases_}}.dump(1) << "\n";
    NUMESH_CHECK(out.good(), numesh::IoError, "torch_check_main: cannot write {}",
                 (dir_ / "cases.json").string());
  }

 private:
  fs::path dir_;
  json cases_ = json::array();
};

// ---------------------------------------------------------------------------------------------
// MLP and RMSNorm.

// The case's parameters for weights stored as `stored` (torch_check.py rounds the fp32 weights
// it is given, and for bf16 the activations each projection multiplies, as numesh does).
json dtype_params(numesh::DType stored) {
  return {{"dtype", std::string(numesh::to_string(stored))}};
}

// The tolerance class of a sharded operator's output with weights stored as `stored`: f16
// weights multiply fp32 activations, so the fp32 class holds; bf16 ones multiply bf16-rounded
// activations, and an fp32 activation in numesh can round to the neighbour of what its float64
// twin in torch rounds to (torch_check.py, "bf16_sharded"). The float64 references keep the
// "reference" class for every dtype.
std::string sharded_class(numesh::DType stored) {
  return stored == numesh::DType::kBF16 ? "bf16_sharded" : "sharded";
}

// The references on [t, h] x [h, f]; with `meshes`, ShardedMlp on each too. With 16-bit
// weights (`stored`), the cases are named with the dtype; bf16 sharded outputs are also compared
// with PyTorch's own bf16 MLP (torch.bfloat16 throughout).
void mlp_cases(Writer& w, const std::string& suffix, std::int64_t t, std::int64_t h, std::int64_t f,
               const std::vector<MeshChoice>& meshes, std::mt19937& rng,
               numesh::DType stored = numesh::DType::kF32) {
  const std::string tail = stored == numesh::DType::kF32
                               ? suffix
                               : suffix + "_" + std::string(numesh::to_string(stored));
  const auto sharded_outputs = [&](Case& c, ops::MlpKind kind, const ops::MlpWeights& mw,
                                   const HostTensor& x) {
    for (const MeshChoice& m : meshes) {
      ops::ShardedMlp mlp(mesh(m.size, m.axis), kind, mw, t);
      const HostTensor y = mlp.forward(x);
      w.output(c, "ShardedMlp " + m.label, 0, sharded_class(stored), y);
      if (stored == numesh::DType::kBF16)
        w.output(c, "ShardedMlp " + m.label, 0, "torch_bf16", y, "y", "torch_bf16");
    }
  };
  {
    Case c = w.begin("mlp_gelu_" + tail, "mlp_gelu", dtype_params(stored));
    const HostTensor x = random_tensor({t, h}, rng);
    ops::MlpWeights mw{.gate = {},
                       .up = random_tensor({h, f}, rng, 0.2f),
                       .down = random_tensor({f, h}, rng, 0.2f)};
    mw.stored_as = ops::MlpFormats::all(stored);
    w.input(c, "x", x);
    w.input(c, "w1", mw.up);
    w.input(c, "w2", mw.down);
    Writer::step(c, 0, t);
    w.output(c, "mlp_gelu_reference", 0, "reference",
             to_host(ops::mlp_gelu_reference(to_matrix(x), to_matrix(mw.up), to_matrix(mw.down),
                                             stored)));
    sharded_outputs(c, ops::MlpKind::kGelu, mw, x);
    w.add(std::move(c));
  }
  // The gated MLPs: SwiGLU through its named reference, GeGLU through mlp_reference.
  const auto gated_case = [&](ops::MlpKind kind, const std::string& reference_label,
                              const auto& reference) {
    const std::string op = "mlp_" + std::string(ops::to_string(kind));
    Case c = w.begin(op + "_" + tail, op, dtype_params(stored));
    const HostTensor x = random_tensor({t, h}, rng);
    ops::MlpWeights mw{.gate = random_tensor({h, f}, rng, 0.2f),
                       .up = random_tensor({h, f}, rng, 0.2f),
                       .down = random_tensor({f, h}, rng, 0.2f)};
    mw.stored_as = ops::MlpFormats::all(stored);
    w.input(c, "x", x);
    w.input(c, "w_gate", mw.gate);
    w.input(c, "w_up", mw.up);
    w.input(c, "w_down", mw.down);
    Writer::step(c, 0, t);
    w.output(c, reference_label, 0, "reference", to_host(reference(x, mw)));
    sharded_outputs(c, kind, mw, x);
    w.add(std::move(c));
  };
  gated_case(ops::MlpKind::kSwiGLU, "mlp_swiglu_reference",
             [&](const HostTensor& x, const ops::MlpWeights& mw) {
               return ops::mlp_swiglu_reference(to_matrix(x), to_matrix(mw.gate), to_matrix(mw.up),
                                                to_matrix(mw.down), stored);
             });
  gated_case(ops::MlpKind::kGeGLU, "mlp_reference (geglu)",
             [](const HostTensor& x, const ops::MlpWeights& mw) {
               return ops::mlp_reference(to_matrix(x), ops::MlpKind::kGeGLU, mw);
             });
}

void rmsnorm_case(Writer& w, std::int64_t t, std::int64_t h, std::mt19937& rng) {
  const float eps = 1e-6f;
  Case c = w.begin("rmsnorm", "rmsnorm", {{"eps", eps}});
  const HostTensor x = random_tensor({t, h}, rng), weight = random_tensor({1, h}, rng);
  w.input(c, "x", x);
  w.input(c, "weight", weight);
  Writer::step(c, 0, t);
  w.output(c, "rmsnorm_reference", 0, "reference",
           to_host(ops::rmsnorm_reference(to_matrix(x), to_matrix(weight), eps)));
  w.add(std::move(c));
}

// ---------------------------------------------------------------------------------------------
// Attention.

json attention_params(const ops::AttentionConfig& a) {
  json p{{"num_heads", a.num_heads}, {"num_kv_heads", a.num_kv_heads},
         {"head_dim", a.head_dim},   {"causal", a.causal},
         {"q_offset", a.q_offset},   {"rope_theta", a.rope_theta}};
  // Hugging Face's rope_scaling entry of config.json.
  if (a.rope_scaling.kind != ops::RopeScaling::Kind::kNone) {
    p["rope_scaling"] = {
        {"rope_type", std::string(ops::to_string(a.rope_scaling.kind))},
        {"factor", a.rope_scaling.factor},
        {"low_freq_factor", a.rope_scaling.low_freq_factor},
        {"high_freq_factor", a.rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", a.rope_scaling.original_max_position}};
  }
  return p;
}

// attention_reference on q [b, t, heads, d] and k, v [b, s, kv_heads, d]; queries at q_offset.
void attention_reference_case(Writer& w, const std::string& name, std::int64_t b, std::int64_t t,
                              std::int64_t s, const ops::AttentionConfig& a, std::mt19937& rng) {
  Case c = w.begin(name, "attention", attention_params(a));
  const HostTensor q = random_tensor({b, t, a.num_heads, a.head_dim}, rng);
  const HostTensor k = random_tensor({b, s, a.num_kv_heads, a.head_dim}, rng);
  const HostTensor v = random_tensor({b, s, a.num_kv_heads, a.head_dim}, rng);
  w.input(c, "q", q);
  w.input(c, "k", k);
  w.input(c, "v", v);
  Writer::step(c, a.q_offset, t);
  w.output(c, "attention_reference", 0, "reference", ops::attention_reference(q, k, v, a));
  w.add(std::move(c));
}

// ShardedAttention on tp1 and tp2 against the layer in torch. With max_len > 0 the calls are
// consecutive chunks of `steps` tokens through the KV cache (prefill, inserts, decode steps);
// with max_len 0 one train call of steps[0] tokens.
void attention_layer_case(Writer& w, const std::string& name, std::int64_t batch,
                          std::int64_t hidden, const ops::AttentionConfig& a, std::int64_t max_len,
                          const std::vector<std::int64_t>& steps, const std::string& check,
                          std::mt19937& rng) {
  json params = attention_params(a);
  params["cache"] = max_len > 0;
  Case c = w.begin(name, "attention_layer", params);
  const std::int64_t qd = a.num_heads * a.head_dim, kvd = a.num_kv_heads * a.head_dim;
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(hidden));
  ops::AttentionWeights aw{
      .wq = random_tensor({hidden, qd}, rng, in_scale),
      .wk = random_tensor({hidden, kvd}, rng, in_scale),
      .wv = random_tensor({hidden, kvd}, rng, in_scale),
      .wo = random_tensor({qd, hidden}, rng, 1.0f / std::sqrt(static_cast<float>(qd)))};
  w.input(c, "wq", aw.wq);
  w.input(c, "wk", aw.wk);
  w.input(c, "wv", aw.wv);
  w.input(c, "wo", aw.wo);
  std::vector<HostTensor> xs;
  std::int64_t position = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    xs.push_back(random_tensor({batch, steps[i], hidden}, rng));
    w.input(c, "x_step" + std::to_string(i), xs.back());
    Writer::step(c, position, steps[i]);
    position += steps[i];
  }
  for (const MeshChoice& m : {kTp1, kTp2}) {
    ops::ShardedAttention layer(mesh(m.size, m.axis), a, aw, batch, max_len);
    position = 0;
    for (std::size_t i = 0; i < steps.size(); ++i) {
      w.output(c, "ShardedAttention " + m.label, static_cast<std::int64_t>(i), check,
               layer.forward(xs[i], position));
      position += steps[i];
    }
  }
  w.add(std::move(c));
}

// ---------------------------------------------------------------------------------------------
// The LM head.

// ShardedLmHead on tp1 and tp2 (vocabulary-parallel): the logits, and the greedy tokens as a
// [1, rows] row of ids compared exactly with torch.argmax.
void lm_head_case(Writer& w, const std::string& name, std::int64_t rows, std::int64_t hidden,
                  std::int64_t vocab, numesh::DType stored, std::mt19937& rng) {
  Case c = w.begin(name, "lm_head", dtype_params(stored));
  const HostTensor x = random_tensor({rows, hidden}, rng);
  const ops::LmHeadWeights lw{
      .weight = random_tensor({hidden, vocab}, rng, 1.0f / std::sqrt(static_cast<float>(hidden))),
      .stored_as = stored};
  w.input(c, "x", x);
  w.input(c, "weight", lw.weight);
  Writer::step(c, 0, rows);
  w.output(c, "lm_head_reference", 0, "reference", ops::lm_head_reference(x, lw));
  for (const MeshChoice& m : {kTp1, kTp2}) {
    ops::ShardedLmHead head(mesh(m.size, m.axis), lw, rows);
    w.output(c, "ShardedLmHead " + m.label, 0, sharded_class(stored), head.logits(x), "logits");
    std::vector<std::int64_t> ids = head.greedy(x);
    w.output(c, "ShardedLmHead " + m.label, 0, "exact", counts(ids), "greedy_ids");
  }
  w.add(std::move(c));
}

// ---------------------------------------------------------------------------------------------
// MoE.

// moe_reference on 12 tokens, hidden 16, 6 experts of intermediate 24, and its statistics.
void moe_case(Writer& w, const std::string& name, std::int64_t k, float capacity_factor,
              bool renormalize, std::mt19937& rng) {
  const std::int64_t t = 12, h = 16, f = 24, e = 6;
  const ops::MoeConfig config{
      .num_experts = e, .top_k = k, .capacity_factor = capacity_factor, .renormalize = renormalize};
  Case c =
      w.begin(name, "moe",
              {{"top_k", k}, {"capacity_factor", capacity_factor}, {"renormalize", renormalize}});
  const HostTensor x = random_tensor({t, h}, rng);
  ops::MoeWeights mw{.router = random_tensor({h, e}, rng),
                     .gate = random_tensor({e, h, f}, rng, 0.2f),
                     .up = random_tensor({e, h, f}, rng, 0.2f),
                     .down = random_tensor({e, f, h}, rng, 0.2f)};
  w.input(c, "x", x);
  w.input(c, "router", mw.router);
  w.input(c, "gate", mw.gate);
  w.input(c, "up", mw.up);
  w.input(c, "down", mw.down);
  Writer::step(c, 0, t);
  ops::MoeStats stats;
  w.output(c, "moe_reference", 0, "reference",
           to_host(ops::moe_reference(to_matrix(x), mw, config, &stats)));
  w.output(c, "moe_reference", 0, "exact", counts(stats.tokens_per_expert), "tokens_per_expert");
  w.add(std::move(c));
}

// ---------------------------------------------------------------------------------------------
// The transformer block.

// One block (a SwiGLU MLP, or a MoE layer when config.moe_every is 1): TransformerReference
// and ShardedTransformer on `meshes`, through consecutive calls of `steps` tokens. The meshes
// have no batch or sequence axis, so MoE routing is one group (all the call's tokens), as the
// reference's default (1, 1) groups assume.
void transformer_case(Writer& w, const std::string& name, const ops::TransformerConfig& config,
                      bool final_norm, std::int64_t batch, std::int64_t max_len,
                      const std::vector<std::int64_t>& steps, const std::vector<MeshChoice>& meshes,
                      std::mt19937& rng, numesh::DType stored = numesh::DType::kF32) {
  const ops::AttentionConfig& a = config.attention;
  json params = attention_params(a);
  params.update({{"hidden", config.hidden},
                 {"layers", config.layers},
                 {"ffn", config.ffn},
                 {"moe_every", config.moe_every},
                 {"num_experts", config.moe.num_experts},
                 {"top_k", config.moe.top_k},
                 {"capacity_factor", config.moe.capacity_factor},
                 {"renormalize", config.moe.renormalize},
                 {"norm_eps", config.norm_eps},
                 {"final_norm", final_norm}});
  params.update(dtype_params(stored));
  Case c = w.begin(name, "transformer", params);
  ops::TransformerWeights tw =
      ops::TransformerWeights::random(config, static_cast<std::uint32_t>(rng()));
  if (!final_norm) tw.final_norm = {};
  tw.store_as(stored);
  for (std::int64_t l = 0; l < config.layers; ++l) {
    const ops::BlockWeights& b = tw.blocks[static_cast<std::size_t>(l)];
    const std::string p = "l" + std::to_string(l) + "_";
    w.input(c, p + "attn_norm", b.attn_norm);
    w.input(c, p + "wq", b.attention.wq);
    w.input(c, p + "wk", b.attention.wk);
    w.input(c, p + "wv", b.attention.wv);
    w.input(c, p + "wo", b.attention.wo);
    w.input(c, p + "ffn_norm", b.ffn_norm);
    if (config.is_moe(l)) {
      w.input(c, p + "router", b.moe.router);
      w.input(c, p + "moe_gate", b.moe.gate);
      w.input(c, p + "moe_up", b.moe.up);
      w.input(c, p + "moe_down", b.moe.down);
    } else {
      w.input(c, p + "w_gate", b.mlp.gate);
      w.input(c, p + "w_up", b.mlp.up);
      w.input(c, p + "w_down", b.mlp.down);
    }
  }
  if (final_norm) w.input(c, "final_norm", tw.final_norm);
  std::vector<HostTensor> xs;
  std::int64_t position = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    xs.push_back(random_tensor({batch, steps[i], config.hidden}, rng));
    w.input(c, "x_step" + std::to_string(i), xs.back());
    Writer::step(c, position, steps[i]);
    position += steps[i];
  }
  ops::TransformerReference reference(config, tw, batch, max_len);
  position = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    w.output(c, "TransformerReference", static_cast<std::int64_t>(i), "reference",
             reference.forward(xs[i], position));
    position += steps[i];
  }
  for (const MeshChoice& m : meshes) {
    ops::ShardedTransformer model(mesh(m.size, m.axis), config, tw, batch, max_len);
    NUMESH_CHECK(model.routing_groups() == 1 && model.sequence_groups() == 1, numesh::ValueError,
                 "torch_check_main: {} on {} routes in {}x{} groups; torch_check.py routes all "
                 "tokens as one",
                 name, m.label, model.routing_groups(), model.sequence_groups());
    position = 0;
    const std::string impl = "ShardedTransformer " + m.label;
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const auto step = static_cast<std::int64_t>(i);
      w.output(c, impl, step, sharded_class(stored), model.forward(xs[i], position));
      if (config.moe_every > 0) {
        w.output(c, impl, step, "exact", counts(model.moe_stats().tokens_per_expert),
                 "tokens_per_expert");
      }
      position += steps[i];
    }
  }
  w.add(std::move(c));
}

void write_cases(Writer& w, std::uint32_t seed) {
  std::mt19937 rng(seed);

  // Dense MLPs and RMSNorm: small, then at a size whose GEMMs the sharded MLP sends to
  // OpenBLAS.
  mlp_cases(w, "small", 7, 32, 88, {}, rng);
  mlp_cases(w, "blas", 64, 256, 512, {kTp1, kTp2}, rng);
  rmsnorm_case(w, 7, 32, rng);

  // attention_reference: tiny MHA/GQA cases, then MQA, long positions, RoPE 500000 and off,
  // not causal.
  using Cfg = ops::AttentionConfig;
  attention_reference_case(w, "attn_mha_prefill", 2, 5, 5,
                           Cfg{.num_heads = 4, .num_kv_heads = 4, .head_dim = 8}, rng);
  attention_reference_case(w, "attn_gqa_prefill", 2, 6, 6,
                           Cfg{.num_heads = 4, .num_kv_heads = 2, .head_dim = 8}, rng);
  attention_reference_case(w, "attn_gqa_decode", 2, 1, 7,
                           Cfg{.num_heads = 4, .num_kv_heads = 2, .head_dim = 8, .q_offset = 6},
                           rng);
  attention_reference_case(w, "attn_mqa_decode_long_rope500k", 1, 1, 3501,
                           Cfg{.num_heads = 4,
                               .num_kv_heads = 1,
                               .head_dim = 128,
                               .q_offset = 3500,
                               .rope_theta = 500000.0f},
                           rng);
  attention_reference_case(w, "attn_gqa_insert_long", 1, 5, 4005,
                           Cfg{.num_heads = 4, .num_kv_heads = 2, .head_dim = 64, .q_offset = 4000},
                           rng);
  attention_reference_case(
      w, "attn_mha_prefill_rope500k", 2, 20, 20,
      Cfg{.num_heads = 2, .num_kv_heads = 2, .head_dim = 64, .rope_theta = 500000.0f}, rng);
  attention_reference_case(
      w, "attn_mha_noncausal_norope", 2, 9, 12,
      Cfg{.num_heads = 3, .num_kv_heads = 3, .head_dim = 64, .causal = false, .rope_theta = 0.0f},
      rng);
  attention_reference_case(
      w, "attn_gqa_noncausal_rope", 2, 4, 10,
      Cfg{.num_heads = 4, .num_kv_heads = 2, .head_dim = 16, .causal = false, .q_offset = 6}, rng);
  // Causal with keys beyond the last query's position (the mask hides them).
  attention_reference_case(w, "attn_gqa_causal_future_keys", 2, 3, 10,
                           Cfg{.num_heads = 4, .num_kv_heads = 2, .head_dim = 16, .q_offset = 2},
                           rng);
  attention_reference_case(
      w, "attn_mqa_prefill_norope", 2, 8, 8,
      Cfg{.num_heads = 4, .num_kv_heads = 1, .head_dim = 32, .rope_theta = 0.0f}, rng);

  // ShardedAttention (tp1, tp2). GQA 8/2, d 64: prefill of 100 (one whole 64-query block and
  // a partial one), an insert of 70 at 100 (blocked, q_offset 100), an insert of 5 (the
  // one-query path), a decode step.
  attention_layer_case(w, "layer_gqa_blocked", 2, 128,
                       Cfg{.num_heads = 8, .num_kv_heads = 2, .head_dim = 64}, 192, {100, 70, 5, 1},
                       "sharded", rng);
  // MQA 4/1, d 64, RoPE 500000, one sequence: prefill of 3000 (46 whole blocks and a partial
  // one), an insert of 80 at 3000, decode steps at 3080 and 3081.
  attention_layer_case(
      w, "layer_mqa_long", 1, 64,
      Cfg{.num_heads = 4, .num_kv_heads = 1, .head_dim = 64, .rope_theta = 500000.0f}, 3100,
      {3000, 80, 1, 1}, "sharded_long", rng);
  // GQA 4/2, d 128, RoPE 10000, one sequence (kv heads split on tp2): prefill of 3000, an
  // insert of 100 at 3000 (64 + 36), a decode step at 3100.
  attention_layer_case(w, "layer_gqa_long_d128", 1, 128,
                       Cfg{.num_heads = 4, .num_kv_heads = 2, .head_dim = 128}, 3101,
                       {3000, 100, 1}, "sharded_long", rng);
  // MHA 4/4, d 128, no RoPE, not causal (queries see every cached key): prefill of 40 and a
  // decode step.
  attention_layer_case(
      w, "layer_mha_noncausal_norope", 2, 96,
      Cfg{.num_heads = 4, .num_kv_heads = 4, .head_dim = 128, .causal = false, .rope_theta = 0.0f},
      64, {40, 1}, "sharded", rng);
  // No cache (train), 70 tokens from position 0: MHA 2/2, d 64, causal; and GQA 4/2, not
  // causal, 20 tokens.
  attention_layer_case(w, "layer_mha_train", 2, 64,
                       Cfg{.num_heads = 2, .num_kv_heads = 2, .head_dim = 64}, 0, {70}, "sharded",
                       rng);
  attention_layer_case(w, "layer_gqa_train_noncausal", 2, 64,
                       Cfg{.num_heads = 4, .num_kv_heads = 2, .head_dim = 64, .causal = false}, 0,
                       {20}, "sharded", rng);

  // MoE reference.
  moe_case(w, "moe_top2_dropless", 2, 0.0f, true, rng);
  moe_case(w, "moe_top1_capacity", 1, 1.0f, true, rng);
  moe_case(w, "moe_top3_raw", 3, 0.0f, false, rng);

  // One transformer block: prefill of 20 (blocked attention), an insert of 3, a decode step.
  ops::TransformerConfig dense{.hidden = 128,
                               .layers = 1,
                               .attention = Cfg{.num_heads = 4, .num_kv_heads = 2, .head_dim = 32},
                               .ffn = 256,
                               .moe = {.num_experts = 4, .top_k = 2},
                               .moe_ffn = 64,
                               .moe_every = 0};
  const std::vector<std::int64_t> block_steps{20, 3, 1};
  transformer_case(w, "block_dense_final_norm", dense, true, 2, 32, block_steps, {kTp1, kTp2}, rng);
  transformer_case(w, "block_dense_bare", dense, false, 2, 32, block_steps, {kTp1, kTp2}, rng);
  ops::TransformerConfig moe = dense;
  moe.moe_every = 1;
  moe.moe.capacity_factor = 0.0f;
  transformer_case(w, "block_moe_top2_dropless", moe, true, 2, 32, block_steps, {kTp1, kTp2, kEp2},
                   rng);
  moe.moe.capacity_factor = 1.0f;
  transformer_case(w, "block_moe_top2_capacity", moe, false, 2, 32, block_steps, {kTp1, kTp2, kEp2},
                   rng);

  // Cases added later come last, so that the earlier ones keep the inputs the seed draws for
  // them (docs/ops.md quotes their errors).
  // The same MLPs with bf16 and f16 weights (the prefill GEMMs through gemm_16bit, the
  // references through their stored_as), and a decode-sized one (the skinny kernels).
  for (numesh::DType stored : {numesh::DType::kBF16, numesh::DType::kF16}) {
    mlp_cases(w, "blas", 64, 256, 512, {kTp1, kTp2}, rng, stored);
    mlp_cases(w, "decode", 3, 256, 1024, {kTp1, kTp2}, rng, stored);
  }
  // RoPE scaling: Llama 3.1's llama3 (theta 500000, factor 8, bands 1 and 4 of 8192) decoding
  // past the original context, and linear (factor 4) in a prefill.
  const ops::RopeScaling llama3 = ops::RopeScaling::llama3(8.0, 1.0, 4.0, 8192);
  attention_reference_case(w, "attn_gqa_decode_llama3_scaling", 1, 1, 9001,
                           Cfg{.num_heads = 4,
                               .num_kv_heads = 2,
                               .head_dim = 128,
                               .q_offset = 9000,
                               .rope_theta = 500000.0f,
                               .rope_scaling = llama3},
                           rng);
  attention_reference_case(w, "attn_mha_prefill_linear_scaling", 2, 20, 20,
                           Cfg{.num_heads = 2,
                               .num_kv_heads = 2,
                               .head_dim = 64,
                               .rope_scaling = ops::RopeScaling::linear(4.0)},
                           rng);
  // GQA 8/2, d 64, llama3 scaling: prefill 100, insert 70, decode (the sharded RoPE kernel).
  attention_layer_case(w, "layer_gqa_llama3_scaling", 2, 128,
                       Cfg{.num_heads = 8,
                           .num_kv_heads = 2,
                           .head_dim = 64,
                           .rope_theta = 500000.0f,
                           .rope_scaling = llama3},
                       192, {100, 70, 1}, "sharded", rng);

  // The dense block with bf16 and f16 weights, and the MoE block with f16 experts (f16 weights
  // multiply fp32 activations, so routing sees what the fp32 cases see; bf16 experts are left
  // to weight_dtype_test, whose bound covers a near-tied expert swapping).
  transformer_case(w, "block_dense_bf16", dense, true, 2, 32, block_steps, {kTp1, kTp2}, rng,
                   numesh::DType::kBF16);
  transformer_case(w, "block_dense_f16", dense, true, 2, 32, block_steps, {kTp1, kTp2}, rng,
                   numesh::DType::kF16);
  transformer_case(w, "block_moe_f16", moe, true, 2, 32, block_steps, {kTp1, kTp2, kEp2}, rng,
                   numesh::DType::kF16);

  // The LM head: a decode row and a prefill of 9 rows over a vocabulary of 1000, fp32 and bf16.
  lm_head_case(w, "lm_head_decode", 1, 128, 1000, numesh::DType::kF32, rng);
  lm_head_case(w, "lm_head_prefill_bf16", 9, 128, 1000, numesh::DType::kBF16, rng);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: torch_check_main DIR [SEED]\n");
    return 2;
  }
  try {
    const fs::path dir = argv[1];
    fs::create_directories(dir);
    Writer w(dir);
    // Another seed draws other inputs and weights (to see how the errors spread); the test
    // uses the default.
    write_cases(w, argc == 3 ? static_cast<std::uint32_t>(std::stoul(argv[2])) : 1234u);
    w.finish();
    return 0;
  } catch (const std::exception& e) {  // numesh::Error, or a SEED that is not a number
    std::fprintf(stderr, "torch_check_main: %s\n", e.what());
    return 1;
  }
}
