#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "numesh/models/hf/architecture_spec.hpp"
#include "numesh/ops/rope_scaling.hpp"
#include "numesh/ops/transformer_config.hpp"

// A Hugging Face config.json read into what numesh needs to build the model: the architecture
// (model_type), its sizes, attention options (GQA, head_dim, RoPE and its scaling, biases,
// q/k norms), MoE routing and the special token ids. Every field is checked against what the
// architecture allows before any weight is read; what the architecture itself fixes (its
// defaults, its always-on biases and norms, its MoE fields) comes from its ArchitectureSpec.

namespace numesh::models {

/// A config.json as numesh reads it. Absent optional fields take transformers' defaults for
/// the architecture; the sizes (vocab_size, hidden_size, intermediate_size or
/// moe_intermediate_size, num_hidden_layers, num_attention_heads) are required.
struct HfConfig {
  Architecture architecture = Architecture::kLlama;
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  /// The dense MLPs' intermediate size (0 when every layer is MoE and the file has none).
  std::int64_t intermediate_size = 0;
  std::int64_t num_hidden_layers = 0;
  std::int64_t num_attention_heads = 0;
  /// Defaults to num_attention_heads.
  std::int64_t num_key_value_heads = 0;
  /// Defaults to hidden_size / num_attention_heads (Qwen3: 128).
  std::int64_t head_dim = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  ops::RopeScaling rope_scaling;
  std::int64_t max_position_embeddings = 2048;
  /// The LM head shares the token embedding's matrix.
  bool tie_word_embeddings = false;
  /// Biases on the q, k and v projections (Qwen2, Qwen2-MoE: always; Llama: attention_bias).
  bool qkv_bias = false;
  /// A bias on the output projection (Llama's attention_bias).
  bool o_bias = false;
  /// Biases on the MLP projections (Llama's mlp_bias; false for the other architectures, whose
  /// MLPs transformers builds without biases whatever the field says).
  bool mlp_bias = false;
  /// RMSNorm over head_dim on q and k before RoPE (Qwen3, Qwen3-MoE).
  bool qk_norm = false;
  /// Attention sees only this many past tokens (Mistral, Mixtral; Qwen2 when use_sliding_window).
  std::optional<std::int64_t> sliding_window;

  /// MoE (Mixtral, Qwen2-MoE, Qwen3-MoE): experts, experts per token, each expert's
  /// intermediate size, whether the k chosen probabilities are renormalised, and which layers
  /// are MoE: layer i unless i is in mlp_only_layers, when (i + 1) % decoder_sparse_step == 0.
  std::int64_t num_experts = 0;
  std::int64_t num_experts_per_tok = 0;
  std::int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  std::int64_t decoder_sparse_step = 1;
  std::vector<std::int64_t> mlp_only_layers;
  /// Qwen2-MoE's shared expert (sigmoid-gated, beside the routed ones; every MoE layer has one,
  /// transformers' default size 5632); 0 for the other architectures.
  std::int64_t shared_expert_intermediate_size = 0;

  /// Token ids from config.json, or generation_config.json when load() finds one (bos_token_id,
  /// eos_token_id: one id or a list).
  std::vector<std::int64_t> bos_token_ids;
  std::vector<std::int64_t> eos_token_ids;

  /// The architecture's spec (architecture_spec(architecture)).
  [[nodiscard]] const ArchitectureSpec& spec() const noexcept;
  /// True when layer `i` is a MoE layer.
  [[nodiscard]] bool is_moe_layer(std::int64_t i) const noexcept;
  /// The longest context numesh runs the model over: max_position_embeddings, or the sliding
  /// window when narrower (within it, windowed attention is full attention; numesh has no
  /// windowed attention yet, so longer contexts are refused rather than computed wrongly).
  [[nodiscard]] std::int64_t max_context() const noexcept;

  /// Parses a config.json document; `source` names it in errors (a path).
  /// Throws: ValueError naming the source and the field: a model_type numesh does not read
  /// (listing those it does), an activation other than the architecture's (hidden_act "silu";
  /// Gemma's hidden_activation "gelu_pytorch_tanh"), a missing or mistyped required
  /// field, a non-positive size, heads that kv heads do not divide, an unknown or invalid
  /// rope_scaling, experts per token outside [1, num_experts].
  static HfConfig parse(const nlohmann::json& config, std::string_view source);
  /// Reads and parses a config.json file (or DIR/config.json when `path` is a directory), then
  /// the generation_config.json beside it when there is one: its bos_token_id and eos_token_id
  /// replace config.json's (transformers generates with them).
  /// Throws: IoError when `path` does not exist, a file cannot be read or is not JSON; what
  /// parse() throws; ValueError naming generation_config.json for a malformed id in it.
  static HfConfig load(const std::filesystem::path& path);

  /// The transformer stack numesh builds for it (blocks, final norm; embeddings and LM head
  /// are separate): mlp_only_layers become TransformerConfig::dense_layers, the shared expert
  /// shared_expert_ffn, the spec's MLP kind mlp_kind and norm offset norm_weight_offset; MLP
  /// biases ride on the weights (CausalLmWeights::load).
  /// Throws: ValueError as TransformerConfig::validate (sizes parse() has already checked).
  [[nodiscard]] ops::TransformerConfig transformer_config() const;
  /// The factor the token embedding's vectors are multiplied by (EmbeddingWeights::
  /// output_scale): sqrt(hidden_size) in fp32 for Gemma, else 1.
  [[nodiscard]] float embedding_scale() const noexcept;
};

}  // namespace numesh::models
