#include "numesh/models/hf/random_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <list>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/models/formats/safetensors_writer.hpp"
#include "numesh/models/hf/hf_config.hpp"
#include "numesh/ops/eigen_views.hpp"

namespace numesh::models {

nlohmann::json small_llama_config(std::int64_t hidden, std::int64_t layers) {
  const std::int64_t heads = hidden / 64;
  return nlohmann::json{{"model_type", "llama"},
                        {"architectures", {"LlamaForCausalLM"}},
                        {"vocab_size", 4096},
                        {"hidden_size", hidden},
                        {"intermediate_size", (4 * hidden + 63) / 64 * 64},
                        {"num_hidden_layers", layers},
                        {"num_attention_heads", heads},
                        {"num_key_value_heads", std::max<std::int64_t>(1, heads / 4)},
                        {"head_dim", 64},
                        {"hidden_act", "silu"},
                        {"max_position_embeddings", 4096},
                        {"rms_norm_eps", 1e-5},
                        {"rope_theta", 500000.0},
                        {"rope_scaling",
                         {{"rope_type", "llama3"},
                          {"factor", 8.0},
                          {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 1024}}},
                        {"tie_word_embeddings", false},
                        {"bos_token_id", 1},
                        {"eos_token_id", 2}};
}

void write_random_model(const std::filesystem::path& dir, const nlohmann::json& config_doc,
                        DType dtype, std::uint32_t seed) {
  const HfConfig c = HfConfig::parse(config_doc, (dir / "config.json").string());
  const ops::TransformerConfig t = c.transformer_config();
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir / "config.json");
    out << config_doc.dump(2) << "\n";
    NUMESH_CHECK(out.good(), IoError, "cannot write {}", (dir / "config.json").string());
  }
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::list<runtime::HostTensor> storage;  // stable addresses for TensorToWrite
  std::vector<TensorToWrite> tensors;
  std::map<std::string, runtime::HostTensor*> by_name;
  // A tensor named twice is a fused one (Phi-3's qkv_proj, gate_up_proj): each call appends
  // its rows, in the order the spec's slices lie (q, k, v; gate, up).
  const auto add = [&](const std::string& name, std::vector<std::int64_t> shape, float scale,
                       float offset, DType stored) {
    runtime::HostTensor part = runtime::HostTensor::zeros(std::move(shape));
    for (float& x : part.data) x = offset + scale * normal(rng);
    if (const auto it = by_name.find(name); it != by_name.end()) {
      it->second->shape.front() += part.shape.front();
      it->second->data.insert(it->second->data.end(), part.data.begin(), part.data.end());
      return;
    }
    runtime::HostTensor& v = storage.emplace_back(std::move(part));
    by_name[name] = &v;
    tensors.push_back({name, &v, stored});
  };
  // nn.Linear [out, in], normal(0, 1/sqrt(in)); RMSNorm weights stay F32, as transformers keeps
  // them in many checkpoints, and numesh reads any of the three dtypes.
  const auto linear = [&](const std::string& name, std::int64_t out, std::int64_t in) {
    add(name, {out, in}, 1.0f / std::sqrt(static_cast<float>(in)), 0.0f, dtype);
  };
  // Norms around 1 as they scale: Gemma's stored w around 0 (it scales by 1 + w).
  const auto norm = [&](const std::string& name) {
    add(name, {c.hidden_size}, 0.1f, 1.0f - c.spec().norm_offset, DType::kF32);
  };
  const std::int64_t h = c.hidden_size, d = t.attention.head_dim;
  // Names from the architecture's spec, the table CausalLmWeights::load reads them by.
  const ArchitectureSpec& spec = c.spec();
  std::int64_t l = -1;  // the layer being written
  const auto hf = [&](std::string_view slot, std::int64_t e = -1) {
    return spec.hf_name(slot, l, e);
  };
  add(hf("embedding.table"), {c.vocab_size, h}, 1.0f, 0.0f, dtype);
  norm(hf("final_norm"));
  for (l = 0; l < t.layers; ++l) {
    norm(hf("layers.{L}.attn_norm"));
    norm(hf("layers.{L}.ffn_norm"));
    linear(hf("layers.{L}.attention.wq"), t.attention.num_heads * d, h);
    linear(hf("layers.{L}.attention.wk"), t.attention.num_kv_heads * d, h);
    linear(hf("layers.{L}.attention.wv"), t.attention.num_kv_heads * d, h);
    linear(hf("layers.{L}.attention.wo"), h, t.attention.num_heads * d);
    if (c.qkv_bias) {
      add(hf("layers.{L}.attention.bq"), {t.attention.num_heads * d}, 0.1f, 0.0f, DType::kF32);
      add(hf("layers.{L}.attention.bk"), {t.attention.num_kv_heads * d}, 0.1f, 0.0f, DType::kF32);
      add(hf("layers.{L}.attention.bv"), {t.attention.num_kv_heads * d}, 0.1f, 0.0f, DType::kF32);
    }
    if (c.o_bias) add(hf("layers.{L}.attention.bo"), {h}, 0.1f, 0.0f, DType::kF32);
    if (c.qk_norm) {
      add(hf("layers.{L}.attention.q_norm"), {d}, 0.1f, 1.0f, DType::kF32);
      add(hf("layers.{L}.attention.k_norm"), {d}, 0.1f, 1.0f, DType::kF32);
    }
    if (t.is_moe(l)) {
      add(hf("layers.{L}.moe.router"), {t.moe.num_experts, h},
          1.0f / std::sqrt(static_cast<float>(h)), 0.0f, DType::kF32);
      for (std::int64_t e = 0; e < t.moe.num_experts; ++e) {
        linear(hf("layers.{L}.moe.gate", e), t.moe_ffn, h);
        linear(hf("layers.{L}.moe.up", e), t.moe_ffn, h);
        linear(hf("layers.{L}.moe.down", e), h, t.moe_ffn);
      }
      if (t.shared_expert_ffn > 0) {  // Qwen2-MoE; its gate is an nn.Linear [1, H] like the router
        linear(hf("layers.{L}.moe.shared_expert.gate"), t.shared_expert_ffn, h);
        linear(hf("layers.{L}.moe.shared_expert.up"), t.shared_expert_ffn, h);
        linear(hf("layers.{L}.moe.shared_expert.down"), h, t.shared_expert_ffn);
        add(hf("layers.{L}.moe.shared_expert_gate"), {1, h},
            1.0f / std::sqrt(static_cast<float>(h)), 0.0f, DType::kF32);
      }
    } else {
      if (ops::mlp_traits(t.mlp_kind).gated) linear(hf("layers.{L}.mlp.gate"), t.ffn, h);
      linear(hf("layers.{L}.mlp.up"), t.ffn, h);
      linear(hf("layers.{L}.mlp.down"), h, t.ffn);
      if (c.mlp_bias) {
        add(hf("layers.{L}.mlp.gate_bias"), {t.ffn}, 0.1f, 0.0f, DType::kF32);
        add(hf("layers.{L}.mlp.up_bias"), {t.ffn}, 0.1f, 0.0f, DType::kF32);
        add(hf("layers.{L}.mlp.down_bias"), {h}, 0.1f, 0.0f, DType::kF32);
      }
    }
  }
  if (!c.tie_word_embeddings) linear(hf("lm_head.weight"), c.vocab_size, h);
  write_safetensors(dir / "model.safetensors", tensors, {{"format", "pt"}});
}

CausalLmWeights initial_weights(const HfConfig& config, std::uint32_t seed, double stddev) {
  NUMESH_CHECK(stddev > 0.0 && std::isfinite(stddev), ValueError,
               "initial weights: stddev {} must be positive", stddev);
  const ops::TransformerConfig t = config.transformer_config();
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, static_cast<float>(stddev));
  const auto matrix = [&](std::vector<std::int64_t> shape) {
    runtime::HostTensor m = runtime::HostTensor::zeros(std::move(shape));
    for (float& x : m.data) x = normal(rng);
    return m;
  };
  const auto filled = [&](std::vector<std::int64_t> shape, float value) {
    runtime::HostTensor m = runtime::HostTensor::zeros(std::move(shape));
    std::fill(m.data.begin(), m.data.end(), value);
    return m;
  };
  // Block and final norms scale by 1 at the start: Gemma's stored w is 0 (1 + w), as
  // transformers' GemmaRMSNorm starts.
  const float unit_norm = 1.0f - config.spec().norm_offset;
  const auto ones = [&](std::vector<std::int64_t> shape) { return filled(std::move(shape), 1.0f); };
  const auto norm = [&](std::vector<std::int64_t> shape) {
    return filled(std::move(shape), unit_norm);
  };
  const std::int64_t h = t.hidden, v = config.vocab_size, d = t.attention.head_dim;
  const std::int64_t q = t.attention.num_heads * d, kv = t.attention.num_kv_heads * d;
  CausalLmWeights w;
  w.embedding.table = matrix({v, h});
  w.embedding.output_scale = config.embedding_scale();
  for (std::int64_t l = 0; l < t.layers; ++l) {
    ops::BlockWeights b;
    b.attn_norm = norm({1, h});
    b.ffn_norm = norm({1, h});
    b.attention.wq = matrix({h, q});
    b.attention.wk = matrix({h, kv});
    b.attention.wv = matrix({h, kv});
    b.attention.wo = matrix({q, h});
    if (config.qkv_bias) {
      b.attention.bq = runtime::HostTensor::zeros({q});
      b.attention.bk = runtime::HostTensor::zeros({kv});
      b.attention.bv = runtime::HostTensor::zeros({kv});
    }
    if (config.o_bias) b.attention.bo = runtime::HostTensor::zeros({h});
    if (config.qk_norm) {
      b.attention.q_norm = ones({d});
      b.attention.k_norm = ones({d});
    }
    if (t.is_moe(l)) {
      const std::int64_t e = t.moe.num_experts, f = t.moe_ffn;
      b.moe.router = matrix({h, e});
      b.moe.gate = matrix({e, h, f});
      b.moe.up = matrix({e, h, f});
      b.moe.down = matrix({e, f, h});
      if (t.shared_expert_ffn > 0) {
        const std::int64_t fs = t.shared_expert_ffn;
        b.moe.shared_expert.gate = matrix({h, fs});
        b.moe.shared_expert.up = matrix({h, fs});
        b.moe.shared_expert.down = matrix({fs, h});
        b.moe.shared_expert_gate = matrix({h, 1});
      }
    } else {
      if (ops::mlp_traits(t.mlp_kind).gated) b.mlp.gate = matrix({h, t.ffn});
      b.mlp.up = matrix({h, t.ffn});
      b.mlp.down = matrix({t.ffn, h});
      if (config.mlp_bias) {
        b.mlp.gate_bias = runtime::HostTensor::zeros({t.ffn});
        b.mlp.up_bias = runtime::HostTensor::zeros({t.ffn});
        b.mlp.down_bias = runtime::HostTensor::zeros({h});
      }
    }
    w.stack.blocks.push_back(std::move(b));
  }
  w.stack.final_norm = norm({1, h});
  if (config.tie_word_embeddings) {
    w.lm_head.weight = ops::transposed(w.embedding.table);
  } else {
    w.lm_head.weight = matrix({h, v});
  }
  return w;
}

}  // namespace numesh::models
