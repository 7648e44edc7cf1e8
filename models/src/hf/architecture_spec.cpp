#include "numesh/models/hf/architecture_spec.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <initializer_list>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::models {

namespace {

// The Hugging Face names, in pieces the architectures share. Llama's names are transformers'
// LlamaForCausalLM's; Mistral, Qwen2 and Qwen3 (and the Qwen-MoE's attention and dense layers)
// kept them.
constexpr std::array kCommonTensors{
    TensorPattern{"embedding.table", "model.embed_tokens.weight", "token_embd.weight"},
    TensorPattern{"final_norm", "model.norm.weight", "output_norm.weight"},
    TensorPattern{"lm_head.weight", "lm_head.weight", "output.weight"},
    TensorPattern{"layers.{L}.attn_norm", "model.layers.{L}.input_layernorm.weight",
                  "blk.{L}.attn_norm.weight"},
    TensorPattern{"layers.{L}.ffn_norm", "model.layers.{L}.post_attention_layernorm.weight",
                  "blk.{L}.ffn_norm.weight"},
    TensorPattern{"layers.{L}.attention.wq", "model.layers.{L}.self_attn.q_proj.weight",
                  "blk.{L}.attn_q.weight"},
    TensorPattern{"layers.{L}.attention.wk", "model.layers.{L}.self_attn.k_proj.weight",
                  "blk.{L}.attn_k.weight"},
    TensorPattern{"layers.{L}.attention.wv", "model.layers.{L}.self_attn.v_proj.weight",
                  "blk.{L}.attn_v.weight"},
    TensorPattern{"layers.{L}.attention.wo", "model.layers.{L}.self_attn.o_proj.weight",
                  "blk.{L}.attn_output.weight"},
    // Biases: Qwen2's q/k/v always; attention_bias puts them on all four in any architecture.
    TensorPattern{"layers.{L}.attention.bq", "model.layers.{L}.self_attn.q_proj.bias",
                  "blk.{L}.attn_q.bias"},
    TensorPattern{"layers.{L}.attention.bk", "model.layers.{L}.self_attn.k_proj.bias",
                  "blk.{L}.attn_k.bias"},
    TensorPattern{"layers.{L}.attention.bv", "model.layers.{L}.self_attn.v_proj.bias",
                  "blk.{L}.attn_v.bias"},
    TensorPattern{"layers.{L}.attention.bo", "model.layers.{L}.self_attn.o_proj.bias",
                  "blk.{L}.attn_output.bias"},
};
constexpr std::array kQkNormTensors{
    TensorPattern{"layers.{L}.attention.q_norm", "model.layers.{L}.self_attn.q_norm.weight",
                  "blk.{L}.attn_q_norm.weight"},
    TensorPattern{"layers.{L}.attention.k_norm", "model.layers.{L}.self_attn.k_norm.weight",
                  "blk.{L}.attn_k_norm.weight"},
};
constexpr std::array kDenseMlpTensors{
    TensorPattern{"layers.{L}.mlp.gate", "model.layers.{L}.mlp.gate_proj.weight",
                  "blk.{L}.ffn_gate.weight"},
    TensorPattern{"layers.{L}.mlp.up", "model.layers.{L}.mlp.up_proj.weight",
                  "blk.{L}.ffn_up.weight"},
    TensorPattern{"layers.{L}.mlp.down", "model.layers.{L}.mlp.down_proj.weight",
                  "blk.{L}.ffn_down.weight"},
};
constexpr std::array kMlpBiasTensors{
    TensorPattern{"layers.{L}.mlp.gate_bias", "model.layers.{L}.mlp.gate_proj.bias",
                  "blk.{L}.ffn_gate.bias"},
    TensorPattern{"layers.{L}.mlp.up_bias", "model.layers.{L}.mlp.up_proj.bias",
                  "blk.{L}.ffn_up.bias"},
    TensorPattern{"layers.{L}.mlp.down_bias", "model.layers.{L}.mlp.down_proj.bias",
                  "blk.{L}.ffn_down.bias"},
};
// Mixtral's sparse block: experts' w1 (gate), w3 (up), w2 (down).
constexpr std::array kMixtralMoeTensors{
    TensorPattern{"layers.{L}.moe.router", "model.layers.{L}.block_sparse_moe.gate.weight",
                  "blk.{L}.ffn_gate_inp.weight"},
    TensorPattern{"layers.{L}.moe.gate", "model.layers.{L}.block_sparse_moe.experts.{E}.w1.weight",
                  "blk.{L}.ffn_gate_exps.weight"},
    TensorPattern{"layers.{L}.moe.up", "model.layers.{L}.block_sparse_moe.experts.{E}.w3.weight",
                  "blk.{L}.ffn_up_exps.weight"},
    TensorPattern{"layers.{L}.moe.down", "model.layers.{L}.block_sparse_moe.experts.{E}.w2.weight",
                  "blk.{L}.ffn_down_exps.weight"},
};
// Qwen-MoE's sparse block, under mlp.
constexpr std::array kQwenMoeTensors{
    TensorPattern{"layers.{L}.moe.router", "model.layers.{L}.mlp.gate.weight",
                  "blk.{L}.ffn_gate_inp.weight"},
    TensorPattern{"layers.{L}.moe.gate", "model.layers.{L}.mlp.experts.{E}.gate_proj.weight",
                  "blk.{L}.ffn_gate_exps.weight"},
    TensorPattern{"layers.{L}.moe.up", "model.layers.{L}.mlp.experts.{E}.up_proj.weight",
                  "blk.{L}.ffn_up_exps.weight"},
    TensorPattern{"layers.{L}.moe.down", "model.layers.{L}.mlp.experts.{E}.down_proj.weight",
                  "blk.{L}.ffn_down_exps.weight"},
};
constexpr std::array kSharedExpertTensors{
    TensorPattern{"layers.{L}.moe.shared_expert.gate",
                  "model.layers.{L}.mlp.shared_expert.gate_proj.weight",
                  "blk.{L}.ffn_gate_shexp.weight"},
    TensorPattern{"layers.{L}.moe.shared_expert.up",
                  "model.layers.{L}.mlp.shared_expert.up_proj.weight",
                  "blk.{L}.ffn_up_shexp.weight"},
    TensorPattern{"layers.{L}.moe.shared_expert.down",
                  "model.layers.{L}.mlp.shared_expert.down_proj.weight",
                  "blk.{L}.ffn_down_shexp.weight"},
    TensorPattern{"layers.{L}.moe.shared_expert_gate",
                  "model.layers.{L}.mlp.shared_expert_gate.weight",
                  "blk.{L}.ffn_gate_inp_shexp.weight"},
};

// Phi-3's: q, k and v in one qkv_proj (GGUF attn_qkv), gate and up in one gate_up_proj (GGUF
// ffn_up, llama.cpp's converter keeping it whole), the rest Llama's.
constexpr std::array kPhi3FusedTensors{
    TensorPattern{"layers.{L}.attention.wq", "model.layers.{L}.self_attn.qkv_proj.weight",
                  "blk.{L}.attn_qkv.weight", FusedPart::kQ},
    TensorPattern{"layers.{L}.attention.wk", "model.layers.{L}.self_attn.qkv_proj.weight",
                  "blk.{L}.attn_qkv.weight", FusedPart::kK},
    TensorPattern{"layers.{L}.attention.wv", "model.layers.{L}.self_attn.qkv_proj.weight",
                  "blk.{L}.attn_qkv.weight", FusedPart::kV},
    TensorPattern{"layers.{L}.mlp.gate", "model.layers.{L}.mlp.gate_up_proj.weight",
                  "blk.{L}.ffn_up.weight", FusedPart::kGate},
    TensorPattern{"layers.{L}.mlp.up", "model.layers.{L}.mlp.gate_up_proj.weight",
                  "blk.{L}.ffn_up.weight", FusedPart::kUp},
    TensorPattern{"layers.{L}.mlp.down", "model.layers.{L}.mlp.down_proj.weight",
                  "blk.{L}.ffn_down.weight"},
};

// The common tensors without q, k and v (which Phi-3 fuses).
std::vector<TensorPattern> unfused_common_tensors() {
  std::vector<TensorPattern> out;
  for (const TensorPattern& t : kCommonTensors) {
    if (t.slot != "layers.{L}.attention.wq" && t.slot != "layers.{L}.attention.wk" &&
        t.slot != "layers.{L}.attention.wv")
      out.push_back(t);
  }
  return out;
}

std::vector<TensorPattern> joined_tensors(
    std::initializer_list<std::span<const TensorPattern>> parts) {
  std::vector<TensorPattern> all;
  for (std::span<const TensorPattern> p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

// The table, in Architecture's order (architecture_spec(Architecture) indexes it). Each entry
// sets what differs from the defaults (Llama's), as docs/models.md's table of model types does.
std::vector<ArchitectureSpec> make_architecture_table() {
  constexpr SlidingWindowRule kQwenWindow = SlidingWindowRule::kUseSlidingWindow;
  const std::vector<TensorPattern> dense = joined_tensors({kCommonTensors, kDenseMlpTensors});
  return {
      {.architecture = Architecture::kLlama,
       .model_types = {"llama"},
       .gguf_name = "llama",
       .tensors = joined_tensors({kCommonTensors, kDenseMlpTensors, kMlpBiasTensors}),
       .mlp_bias_field = true,
       .gguf_permutes_qk = true,
       .gguf_vocab_size = true,
       .gguf_rope_dimension_count = true,
       .gguf_with_experts = Architecture::kMixtral},
      {.architecture = Architecture::kMistral,
       .model_types = {"mistral"},
       .gguf_name = "llama",
       .tensors = dense,
       .sliding_window = SlidingWindowRule::kWhenSet,
       .gguf_permutes_qk = true,
       .gguf_vocab_size = true,
       .gguf_rope_dimension_count = true},
      {.architecture = Architecture::kQwen2,
       .model_types = {"qwen2"},
       .gguf_name = "qwen2",
       .tensors = dense,
       .qkv_bias = true,
       .sliding_window = kQwenWindow},
      {.architecture = Architecture::kQwen3,
       .model_types = {"qwen3"},
       .gguf_name = "qwen3",
       .tensors = joined_tensors({kCommonTensors, kQkNormTensors, kDenseMlpTensors}),
       .qk_norm = true,
       .sliding_window = kQwenWindow,
       .default_head_dim = 128},
      {.architecture = Architecture::kMixtral,
       .model_types = {"mixtral"},
       .gguf_name = "llama",
       .tensors = joined_tensors({kCommonTensors, kMixtralMoeTensors}),
       .sliding_window = SlidingWindowRule::kWhenSet,
       .default_rms_norm_eps = 1e-5,
       .default_rope_theta = 1e6,
       .moe = MoeSpec{.num_experts_field = "num_local_experts",
                      .expert_ffn_field = "intermediate_size",
                      .always_renormalize = true},
       .gguf_permutes_qk = true,
       .gguf_vocab_size = true,
       .gguf_rope_dimension_count = true},
      {.architecture = Architecture::kQwen2Moe,
       .model_types = {"qwen2_moe"},
       .gguf_name = "qwen2moe",
       .tensors = joined_tensors(
           {kCommonTensors, kDenseMlpTensors, kQwenMoeTensors, kSharedExpertTensors}),
       .qkv_bias = true,
       .sliding_window = kQwenWindow,
       .moe = MoeSpec{.num_experts_field = "num_experts",
                      .expert_ffn_field = "moe_intermediate_size",
                      .sparse_layer_fields = true,
                      .shared_expert = true}},
      {.architecture = Architecture::kQwen3Moe,
       .model_types = {"qwen3_moe"},
       .gguf_name = "qwen3moe",
       .tensors =
           joined_tensors({kCommonTensors, kQkNormTensors, kDenseMlpTensors, kQwenMoeTensors}),
       .qk_norm = true,
       .sliding_window = kQwenWindow,
       .default_head_dim = 128,
       .moe = MoeSpec{.num_experts_field = "num_experts",
                      .expert_ffn_field = "moe_intermediate_size",
                      .sparse_layer_fields = true,
                      .gguf_norm_topk_prob = true}},
      // transformers' GemmaForCausalLM: Llama's names and block, GeGLU (gelu_pytorch_tanh, from
      // hidden_activation), norms of 1 + w, the embedding scaled by sqrt(hidden), head_dim 256
      // and tied embeddings by default; llama.cpp's "gemma" (NEOX RoPE: no Q/K permutation).
      {.architecture = Architecture::kGemma,
       .model_types = {"gemma"},
       .gguf_name = "gemma",
       .tensors = dense,
       .mlp_kind = ops::MlpKind::kGeGLU,
       .hidden_act = "gelu_pytorch_tanh",
       .activation_field = "hidden_activation",
       .norm_offset = 1.0f,
       .embedding_scale = EmbeddingScale::kSqrtHidden,
       .default_head_dim = 256,
       .default_tie_word_embeddings = true,
       .gguf_has_output = false,
       .gguf_rope_base = false},
      // transformers' Phi3ForCausalLM (Phi-3 mini and medium): Llama's block and names but for
      // the fused qkv_proj and gate_up_proj, a sliding window; llama.cpp's "phi3" (NEOX RoPE:
      // no Q/K permutation).
      {.architecture = Architecture::kPhi3,
       .model_types = {"phi3"},
       .gguf_name = "phi3",
       .tensors = joined_tensors({unfused_common_tensors(), kPhi3FusedTensors}),
       .sliding_window = SlidingWindowRule::kWhenSet,
       .default_rms_norm_eps = 1e-5,
       .gguf_sliding_window = true,
       .gguf_rope_dimension_count = true},
  };
}

const std::vector<ArchitectureSpec>& architecture_table() {
  static const std::vector<ArchitectureSpec> kTable = make_architecture_table();
  return kTable;
}

}  // namespace

bool takes_norm_offset(std::string_view slot) noexcept {
  return slot == "layers.{L}.attn_norm" || slot == "layers.{L}.ffn_norm" || slot == "final_norm";
}

std::string_view fused_part_name(FusedPart part) noexcept {
  switch (part) {
    case FusedPart::kWhole:
      return "whole";
    case FusedPart::kQ:
      return "q";
    case FusedPart::kK:
      return "k";
    case FusedPart::kV:
      return "v";
    case FusedPart::kGate:
      return "gate";
    case FusedPart::kUp:
      return "up";
  }
  return "?";
}

FusedRows fused_rows(FusedPart part, std::int64_t q_rows, std::int64_t kv_rows, std::int64_t ffn,
                     std::int64_t whole_rows) noexcept {
  const std::int64_t qkv = q_rows + 2 * kv_rows;
  switch (part) {
    case FusedPart::kWhole:
      return {.offset = 0, .rows = whole_rows, .total = whole_rows};
    case FusedPart::kQ:
      return {.offset = 0, .rows = q_rows, .total = qkv};
    case FusedPart::kK:
      return {.offset = q_rows, .rows = kv_rows, .total = qkv};
    case FusedPart::kV:
      return {.offset = q_rows + kv_rows, .rows = kv_rows, .total = qkv};
    case FusedPart::kGate:
      return {.offset = 0, .rows = ffn, .total = 2 * ffn};
    case FusedPart::kUp:
      return {.offset = ffn, .rows = ffn, .total = 2 * ffn};
  }
  return {};
}

std::string_view to_string(Architecture a) noexcept {
  const auto i = static_cast<std::size_t>(a);
  return i < architecture_table().size() ? architecture_table()[i].model_types.front()
                                         : std::string_view("?");
}

const TensorPattern* ArchitectureSpec::find(std::string_view slot) const noexcept {
  for (const TensorPattern& t : tensors) {
    if (t.slot == slot) return &t;
  }
  return nullptr;
}

namespace {

// `pattern` with "{L}" replaced by `layer` and "{E}" by `expert` (which must then be set).
std::string expand(std::string_view pattern, std::int64_t layer, std::int64_t expert,
                   std::string_view model_type, std::string_view slot) {
  std::string name;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const std::string_view rest = pattern.substr(i);
    if (rest.starts_with("{L}")) {
      name += std::to_string(layer);
      i += 2;
    } else if (rest.starts_with("{E}")) {
      NUMESH_CHECK(expert >= 0, ValueError, "{}: weight '{}' ({}) is one tensor per expert",
                   model_type, slot, pattern);
      name += std::to_string(expert);
      i += 2;
    } else {
      name += pattern[i];
    }
  }
  return name;
}

const TensorPattern& known(const ArchitectureSpec& spec, std::string_view slot) {
  const TensorPattern* t = spec.find(slot);
  if (t == nullptr) {
    throw KeyError(std::string(slot), fmt::format("{} has no weight '{}'", spec.model_types.front(),
                                                  std::string(slot)));
  }
  return *t;
}

}  // namespace

std::string ArchitectureSpec::hf_name(std::string_view slot, std::int64_t layer,
                                      std::int64_t expert) const {
  return expand(known(*this, slot).hf, layer, expert, model_types.front(), slot);
}

std::string ArchitectureSpec::gguf_name_of(std::string_view slot, std::int64_t layer) const {
  return expand(known(*this, slot).gguf, layer, -1, model_types.front(), slot);
}

std::span<const ArchitectureSpec> architecture_specs() noexcept { return architecture_table(); }

const ArchitectureSpec& architecture_spec(Architecture architecture) noexcept {
  const auto i = static_cast<std::size_t>(architecture);
  NUMESH_DCHECK(i < architecture_table().size() &&
                architecture_table()[i].architecture == architecture);
  return architecture_table()[i];
}

const ArchitectureSpec& architecture_spec(std::string_view model_type, std::string_view source) {
  std::vector<std::string_view> names;
  for (const ArchitectureSpec& s : architecture_table()) {
    for (std::string_view name : s.model_types) {
      if (name == model_type) return s;
      names.push_back(name);
    }
  }
  throw ValueError(
      fmt::format("{}: model_type '{}' is not an architecture numesh reads (it reads {})", source,
                  model_type, fmt::join(names, ", ")));
}

}  // namespace numesh::models
