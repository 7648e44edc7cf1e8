#include "numesh/models/hf/hf_weights.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../transpose.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::models {

namespace {

using runtime::HostTensor;

// Reads tensors of one checkpoint, checking each shape against what the config implies. With
// `defer`, matrix() returns a shape-only tensor and records where its values are instead.
class Reader {
 public:
  Reader(const SafetensorsCheckpoint& checkpoint, std::map<std::string, MatrixSource>* deferred)
      : checkpoint_(checkpoint), deferred_(deferred) {}

  // Checks tensor `name`'s shape is `expected`.
  void check(const std::string& name, const std::vector<std::int64_t>& expected) const {
    const TensorInfo& info = checkpoint_.info(name);
    NUMESH_CHECK(info.shape == expected, ShapeError,
                 "{}: tensor {} is [{}], the config implies [{}]", checkpoint_.directory().string(),
                 name, fmt::join(info.shape, ", "), fmt::join(expected, ", "));
  }
  // The tensor as stored, after checking its shape is `expected`.
  HostTensor read(const std::string& name, const std::vector<std::int64_t>& expected) const {
    check(name, expected);
    HostTensor t = HostTensor::zeros(expected);
    checkpoint_.read(name, DType::kF32, std::as_writable_bytes(std::span<float>(t.data)));
    return t;
  }
  // A small nn.Linear weight [out, in] (a router, a gate) read and transposed to [in, out].
  HostTensor linear(const std::string& name, std::int64_t in, std::int64_t out) const {
    return transposed(read(name, {out, in}));
  }
  // The large matrix at `slot`: nn.Linear weights [out, in] (one, or one per expert stacked
  // into [E, in, out]) transposed to [in, out], or, when not `transposed`, one tensor as it is.
  HostTensor matrix(const std::string& slot, const MatrixSource& source, std::int64_t in,
                    std::int64_t out) const {
    const auto experts = static_cast<std::int64_t>(source.tensors.size());
    std::vector<std::int64_t> shape =
        source.transposed ? std::vector<std::int64_t>{in, out} : std::vector<std::int64_t>{out, in};
    if (source.tensors.size() > 1) shape.insert(shape.begin(), experts);
    for (const std::string& name : source.tensors) check(name, {out, in});
    if (deferred_ != nullptr) {
      (*deferred_)[slot] = source;
      return HostTensor::shape_only(shape);
    }
    if (!source.transposed) return read(source.tensors.front(), {out, in});
    HostTensor stacked = HostTensor::zeros(shape);
    for (std::int64_t e = 0; e < experts; ++e) {
      const HostTensor m = linear(source.tensors[static_cast<std::size_t>(e)], in, out);
      std::copy(m.data.begin(), m.data.end(), stacked.data.begin() + e * in * out);
    }
    return stacked;
  }
  // An RMSNorm weight [H] as a [1, H] row.
  HostTensor norm(const std::string& name, std::int64_t h) const {
    HostTensor t = read(name, {h});
    t.shape = {1, h};
    return t;
  }

  // In 64 x 64 tiles, so that both the reads and the writes stay within a few cache lines
  // (element by element, the strided writes made loading 4x slower).
  static HostTensor transposed(const HostTensor& m) {
    HostTensor t = HostTensor::zeros({m.shape[1], m.shape[0]});
    detail::transpose(reinterpret_cast<const std::byte*>(m.data.data()), m.shape[0], m.shape[1],
                      sizeof(float), reinterpret_cast<std::byte*>(t.data.data()), m.shape[0]);
    return t;
  }

 private:
  const SafetensorsCheckpoint& checkpoint_;
  std::map<std::string, MatrixSource>* deferred_;
};

// One linear weight's source.
MatrixSource linear_source(std::string name) { return MatrixSource{.tensors = {std::move(name)}}; }

// The weights, read whole into host memory, or (with `deferred`) their large matrices left
// shape-only with their sources recorded there.
CausalLmWeights load_weights(const HfConfig& config, const SafetensorsCheckpoint& checkpoint,
                             DType stored_as, std::map<std::string, MatrixSource>* deferred) {
  const ops::TransformerConfig t = config.transformer_config();
  const Reader r(checkpoint, deferred);
  const std::int64_t h = t.hidden, v = config.vocab_size, d = t.attention.head_dim;
  const std::int64_t q_out = t.attention.num_heads * d, kv_out = t.attention.num_kv_heads * d;
  CausalLmWeights w;
  const MatrixSource table{.tensors = {"model.embed_tokens.weight"}, .transposed = false};
  w.embedding.table = r.matrix("embedding.table", table, h, v);
  w.embedding.stored_as = stored_as;
  for (std::int64_t l = 0; l < t.layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    const std::string slot = fmt::format("layers.{}.", l);  // ShardedTransformer::weights()'s names
    ops::BlockWeights b;
    b.attn_norm = r.norm(p + "input_layernorm.weight", h);
    b.ffn_norm = r.norm(p + "post_attention_layernorm.weight", h);
    b.attention.wq =
        r.matrix(slot + "attention.wq", linear_source(p + "self_attn.q_proj.weight"), h, q_out);
    b.attention.wk =
        r.matrix(slot + "attention.wk", linear_source(p + "self_attn.k_proj.weight"), h, kv_out);
    b.attention.wv =
        r.matrix(slot + "attention.wv", linear_source(p + "self_attn.v_proj.weight"), h, kv_out);
    b.attention.wo =
        r.matrix(slot + "attention.wo", linear_source(p + "self_attn.o_proj.weight"), q_out, h);
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
      const auto experts = [&](const char* mixtral_name, const char* name) {
        MatrixSource s;
        for (std::int64_t x = 0; x < e; ++x) {
          s.tensors.push_back(
              fmt::format("{}experts.{}.{}.weight", moe, x, mixtral ? mixtral_name : name));
        }
        return s;
      };
      b.moe.gate = r.matrix(slot + "moe.gate", experts("w1", "gate_proj"), h, f);
      b.moe.up = r.matrix(slot + "moe.up", experts("w3", "up_proj"), h, f);
      b.moe.down = r.matrix(slot + "moe.down", experts("w2", "down_proj"), f, h);
      if (t.shared_expert_ffn > 0) {  // Qwen2-MoE
        const std::int64_t fs = t.shared_expert_ffn;
        const std::string se = slot + "moe.shared_expert.";
        b.moe.shared_expert.gate =
            r.matrix(se + "gate", linear_source(moe + "shared_expert.gate_proj.weight"), h, fs);
        b.moe.shared_expert.up =
            r.matrix(se + "up", linear_source(moe + "shared_expert.up_proj.weight"), h, fs);
        b.moe.shared_expert.down =
            r.matrix(se + "down", linear_source(moe + "shared_expert.down_proj.weight"), fs, h);
        b.moe.shared_expert_gate = r.linear(moe + "shared_expert_gate.weight", h, 1);
      }
    } else {
      b.mlp.gate = r.matrix(slot + "mlp.gate", linear_source(p + "mlp.gate_proj.weight"), h, t.ffn);
      b.mlp.up = r.matrix(slot + "mlp.up", linear_source(p + "mlp.up_proj.weight"), h, t.ffn);
      b.mlp.down = r.matrix(slot + "mlp.down", linear_source(p + "mlp.down_proj.weight"), t.ffn, h);
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
  w.lm_head.weight = r.matrix(
      "lm_head.weight",
      linear_source(config.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"), h,
      v);
  w.lm_head.stored_as = stored_as;
  return w;
}

}  // namespace

CausalLmWeights CausalLmWeights::load(const HfConfig& config,
                                      const SafetensorsCheckpoint& checkpoint, DType stored_as) {
  return load_weights(config, checkpoint, stored_as, nullptr);
}

std::string hf_tensor_name(std::string_view slot) {
  static const std::map<std::string, std::string, std::less<>> kTop{
      {"embedding.table", "model.embed_tokens.weight"},
      {"final_norm", "model.norm.weight"},
      {"lm_head.weight", "lm_head.weight"}};
  static const std::map<std::string, std::string, std::less<>> kInBlock{
      {"attn_norm", "input_layernorm.weight"},
      {"ffn_norm", "post_attention_layernorm.weight"},
      {"attention.wq", "self_attn.q_proj.weight"},
      {"attention.wk", "self_attn.k_proj.weight"},
      {"attention.wv", "self_attn.v_proj.weight"},
      {"attention.wo", "self_attn.o_proj.weight"},
      {"mlp.gate", "mlp.gate_proj.weight"},
      {"mlp.up", "mlp.up_proj.weight"},
      {"mlp.down", "mlp.down_proj.weight"},
      {"attention.bq", "self_attn.q_proj.bias"},
      {"attention.bk", "self_attn.k_proj.bias"},
      {"attention.bv", "self_attn.v_proj.bias"},
      {"attention.bo", "self_attn.o_proj.bias"},
      {"attention.q_norm", "self_attn.q_norm.weight"},
      {"attention.k_norm", "self_attn.k_norm.weight"},
      {"mlp.gate_bias", "mlp.gate_proj.bias"},
      {"mlp.up_bias", "mlp.up_proj.bias"},
      {"mlp.down_bias", "mlp.down_proj.bias"}};
  if (const auto it = kTop.find(slot); it != kTop.end()) return it->second;
  constexpr std::string_view kLayers = "layers.";
  if (slot.starts_with(kLayers)) {
    const std::string_view rest = slot.substr(kLayers.size());
    const std::size_t dot = rest.find('.');
    const std::string_view layer = rest.substr(0, dot);
    const bool digits = !layer.empty() && std::all_of(layer.begin(), layer.end(),
                                                      [](char c) { return c >= '0' && c <= '9'; });
    if (digits && dot != std::string_view::npos) {
      if (const auto it = kInBlock.find(rest.substr(dot + 1)); it != kInBlock.end()) {
        return fmt::format("model.layers.{}.{}", layer, it->second);
      }
    }
  }
  throw KeyError(std::string(slot),
                 fmt::format("no Hugging Face tensor is known for the weight '{}'", slot));
}

std::vector<HfTensorPart> hf_tensor_parts(std::string_view slot, Architecture architecture,
                                          std::int64_t experts) {
  // "layers.L.moe.NAME": the MoE slots; everything else is a dense slot.
  constexpr std::string_view kLayers = "layers.", kMoe = ".moe.";
  const std::size_t moe_at = slot.find(kMoe);
  if (!slot.starts_with(kLayers) || moe_at == std::string_view::npos)
    return {HfTensorPart{hf_tensor_name(slot)}};
  const std::string_view layer = slot.substr(kLayers.size(), moe_at - kLayers.size());
  const std::string_view part = slot.substr(moe_at + kMoe.size());
  const bool mixtral = architecture == Architecture::kMixtral;
  const std::string block =
      fmt::format("model.layers.{}.{}", layer, mixtral ? "block_sparse_moe." : "mlp.");
  if (part == "router") return {HfTensorPart{block + "gate.weight", -1, true}};
  // Qwen2-MoE's shared expert: its matrices stored out-in as nn.Linear holds them, its gate
  // [H, 1] as the router is, transposed.
  static const std::map<std::string, std::string, std::less<>> kShared{
      {"shared_expert.gate", "shared_expert.gate_proj.weight"},
      {"shared_expert.up", "shared_expert.up_proj.weight"},
      {"shared_expert.down", "shared_expert.down_proj.weight"}};
  if (const auto shared = kShared.find(part); shared != kShared.end() && !mixtral) {
    return {HfTensorPart{block + shared->second}};
  }
  if (part == "shared_expert_gate" && !mixtral)
    return {HfTensorPart{block + "shared_expert_gate.weight", -1, true}};
  static const std::map<std::string, std::pair<std::string, std::string>, std::less<>> kExperts{
      {"gate", {"w1", "gate_proj"}}, {"up", {"w3", "up_proj"}}, {"down", {"w2", "down_proj"}}};
  const auto it = kExperts.find(part);
  if (it == kExperts.end()) {
    throw KeyError(std::string(slot),
                   fmt::format("no Hugging Face tensor is known for the weight '{}'", slot));
  }
  std::vector<HfTensorPart> parts;
  for (std::int64_t e = 0; e < experts; ++e) {
    parts.push_back({fmt::format("{}experts.{}.{}.weight", block, e,
                                 mixtral ? it->second.first : it->second.second),
                     e, false});
  }
  return parts;
}

DeferredCausalLmWeights CausalLmWeights::deferred(const HfConfig& config,
                                                  const SafetensorsCheckpoint& checkpoint,
                                                  DType stored_as) {
  DeferredCausalLmWeights d;
  d.weights = load_weights(config, checkpoint, stored_as, &d.sources);
  return d;
}

}  // namespace numesh::models
