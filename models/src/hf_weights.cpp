#include "numesh/models/hf_weights.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::models {

namespace {

using runtime::HostTensor;

// Reads tensors of one checkpoint, checking each shape against what the config implies.
class Reader {
 public:
  explicit Reader(const SafetensorsCheckpoint& checkpoint) : checkpoint_(checkpoint) {}

  // The tensor as stored, after checking its shape is `expected`.
  HostTensor read(const std::string& name, const std::vector<std::int64_t>& expected) const {
    const TensorInfo& info = checkpoint_.info(name);
    NUMESH_CHECK(info.shape == expected, ShapeError, "{}: tensor {} is [{}], the config implies [{}]",
                 checkpoint_.directory().string(), name, fmt::join(info.shape, ", "), fmt::join(expected, ", "));
    HostTensor t = HostTensor::zeros(expected);
    checkpoint_.read(name, DType::kF32, std::as_writable_bytes(std::span<float>(t.data)));
    return t;
  }
  // An nn.Linear weight [out, in] read and transposed to [in, out].
  HostTensor linear(const std::string& name, std::int64_t in, std::int64_t out) const {
    return transposed(read(name, {out, in}));
  }
  // An RMSNorm weight [H] as a [1, H] row.
  HostTensor norm(const std::string& name, std::int64_t h) const {
    HostTensor t = read(name, {h});
    t.shape = {1, h};
    return t;
  }
  bool contains(const std::string& name) const { return checkpoint_.contains(name); }

  // In 64 x 64 tiles, so that both the reads and the writes stay within a few cache lines
  // (element by element, the strided writes made loading 4x slower).
  static HostTensor transposed(const HostTensor& m) {
    constexpr std::int64_t kTile = 64;
    const std::int64_t rows = m.shape[0], cols = m.shape[1];
    HostTensor t = HostTensor::zeros({cols, rows});
    const float* src = m.data.data();
    float* dst = t.data.data();
    for (std::int64_t r0 = 0; r0 < rows; r0 += kTile) {
      for (std::int64_t c0 = 0; c0 < cols; c0 += kTile) {
        const std::int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
        for (std::int64_t r = r0; r < r1; ++r) {
          for (std::int64_t c = c0; c < c1; ++c) dst[c * rows + r] = src[r * cols + c];
        }
      }
    }
    return t;
  }

 private:
  const SafetensorsCheckpoint& checkpoint_;
};

// Copies expert e's [rows, cols] matrix into slice e of a stacked [E, rows, cols] tensor.
void put_expert(HostTensor& stacked, std::int64_t e, const HostTensor& m) {
  std::copy(m.data.begin(), m.data.end(), stacked.data.begin() + static_cast<std::ptrdiff_t>(e) * static_cast<std::ptrdiff_t>(m.data.size()));
}

}  // namespace

CausalLmWeights CausalLmWeights::load(const HfConfig& config, const SafetensorsCheckpoint& checkpoint, DType stored_as) {
  const ops::TransformerConfig t = config.transformer_config();
  const Reader r(checkpoint);
  const std::int64_t h = t.hidden, v = config.vocab_size, d = t.attention.head_dim;
  const std::int64_t q_out = t.attention.num_heads * d, kv_out = t.attention.num_kv_heads * d;
  CausalLmWeights w;
  w.embedding.table = r.read("model.embed_tokens.weight", {v, h});
  w.embedding.stored_as = stored_as;
  for (std::int64_t l = 0; l < t.layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    ops::BlockWeights b;
    b.attn_norm = r.norm(p + "input_layernorm.weight", h);
    b.ffn_norm = r.norm(p + "post_attention_layernorm.weight", h);
    b.attention.wq = r.linear(p + "self_attn.q_proj.weight", h, q_out);
    b.attention.wk = r.linear(p + "self_attn.k_proj.weight", h, kv_out);
    b.attention.wv = r.linear(p + "self_attn.v_proj.weight", h, kv_out);
    b.attention.wo = r.linear(p + "self_attn.o_proj.weight", q_out, h);
    if (config.qkv_bias) {
      b.attention.bq = r.read(p + "self_attn.q_proj.bias", {q_out});
      b.attention.bk = r.read(p + "self_attn.k_proj.bias", {kv_out});
      b.attention.bv = r.read(p + "self_attn.v_proj.bias", {kv_out});
    }
    if (config.o_bias) b.attention.bo = r.read(p + "self_attn.o_proj.bias", {h});
    if (config.qk_norm) {
      b.attention.q_norm = r.read(p + "self_attn.q_norm.weight", {d});
      b.attention.k_norm = r.read(p + "self_attn.k_norm.weight", {d});
    }
    if (t.is_moe(l)) {
      const std::int64_t e = t.moe.num_experts, f = t.moe_ffn;
      const bool mixtral = config.architecture == Architecture::kMixtral;
      const std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
      b.moe.router = r.linear(moe + "gate.weight", h, e);
      b.moe.gate = HostTensor::zeros({e, h, f});
      b.moe.up = HostTensor::zeros({e, h, f});
      b.moe.down = HostTensor::zeros({e, f, h});
      for (std::int64_t x = 0; x < e; ++x) {
        const std::string ep = fmt::format("{}experts.{}.", moe, x);
        put_expert(b.moe.gate, x, r.linear(ep + (mixtral ? "w1.weight" : "gate_proj.weight"), h, f));
        put_expert(b.moe.up, x, r.linear(ep + (mixtral ? "w3.weight" : "up_proj.weight"), h, f));
        put_expert(b.moe.down, x, r.linear(ep + (mixtral ? "w2.weight" : "down_proj.weight"), f, h));
      }
      if (t.shared_expert_ffn > 0) {  // Qwen2-MoE
        const std::int64_t fs = t.shared_expert_ffn;
        b.moe.shared_expert.gate = r.linear(moe + "shared_expert.gate_proj.weight", h, fs);
        b.moe.shared_expert.up = r.linear(moe + "shared_expert.up_proj.weight", h, fs);
        b.moe.shared_expert.down = r.linear(moe + "shared_expert.down_proj.weight", fs, h);
        b.moe.shared_expert_gate = r.linear(moe + "shared_expert_gate.weight", h, 1);
      }
    } else {
      b.mlp.gate = r.linear(p + "mlp.gate_proj.weight", h, t.ffn);
      b.mlp.up = r.linear(p + "mlp.up_proj.weight", h, t.ffn);
      b.mlp.down = r.linear(p + "mlp.down_proj.weight", t.ffn, h);
      if (config.mlp_bias) {
        b.mlp.gate_bias = r.read(p + "mlp.gate_proj.bias", {t.ffn});
        b.mlp.up_bias = r.read(p + "mlp.up_proj.bias", {t.ffn});
        b.mlp.down_bias = r.read(p + "mlp.down_proj.bias", {h});
      }
    }
    w.stack.blocks.push_back(std::move(b));
  }
  w.stack.final_norm = r.norm("model.norm.weight", h);
  w.stack.store_as(stored_as);
  // Tied models may still ship lm_head.weight (a copy); the embedding is the one they use.
  w.lm_head.weight = config.tie_word_embeddings ? Reader::transposed(w.embedding.table)
                                                : r.linear("lm_head.weight", h, v);
  w.lm_head.stored_as = stored_as;
  return w;
}

}  // namespace numesh::models
