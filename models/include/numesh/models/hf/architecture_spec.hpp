#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "numesh/ops/mlp_config.hpp"

// The decoder-only architectures numesh reads, each described as data: the model_type strings
// it answers to, its GGUF name, every weight's Hugging Face tensor name, its MLP, and the quirks
// that belong to the architecture rather than to one checkpoint's config.json. Adding an
// architecture whose parts numesh already has is one more entry in architecture_spec.cpp's
// table (and its Architecture value); HfConfig, CausalLmWeights, the trainer's saver and
// write_random_model read everything from here.

namespace numesh::models {

/// The decoder-only architectures numesh reads (config.json's model_type).
enum class Architecture : std::uint8_t {
  kLlama,  ///< "llama": Llama 1/2/3, TinyLlama, SmolLM; optional biases, llama3/linear RoPE scaling
  kMistral,   ///< "mistral": Llama's block with a sliding window
  kQwen2,     ///< "qwen2": q, k, v projections with biases
  kQwen3,     ///< "qwen3": RMSNorm on each head of q and k before RoPE
  kMixtral,   ///< "mixtral": every layer a top-k MoE (block_sparse_moe), renormalised
  kQwen2Moe,  ///< "qwen2_moe": MoE layers with a gated shared expert, q/k/v biases
  kQwen3Moe,  ///< "qwen3_moe": MoE layers, q/k norms
  kGemma,     ///< "gemma": GeGLU, RMSNorms scaling by 1 + w, embedding times sqrt(hidden)
  kPhi3,      ///< "phi3": Llama's block with q, k, v in one qkv_proj and gate, up in gate_up_proj
};

/// The model_type string of an architecture ("?" for a value outside the enum).
std::string_view to_string(Architecture a) noexcept;

/// How the token embedding's output is scaled before the first block.
enum class EmbeddingScale : std::uint8_t {
  kNone,        ///< as looked up
  kSqrtHidden,  ///< times sqrt(hidden_size), in fp32 (Gemma)
};

/// When config.json's sliding_window restricts attention.
enum class SlidingWindowRule : std::uint8_t {
  kNever,             ///< Llama: the field, if any, is ignored
  kWhenSet,           ///< Mistral, Mixtral: whenever sliding_window is set
  kUseSlidingWindow,  ///< Qwen: only when use_sliding_window is also true
};

/// Which rows of a fused Hugging Face tensor a slot is (Phi-3's qkv_proj [q + 2 kv, H] holds
/// q's rows, then k's, then v's; its gate_up_proj [2 F, H] gate's, then up's).
enum class FusedPart : std::uint8_t {
  kWhole,  ///< the tensor is the slot's alone
  kQ,      ///< rows [0, heads * head_dim) of a qkv tensor
  kK,      ///< the next kv_heads * head_dim rows
  kV,      ///< the last kv_heads * head_dim rows
  kGate,   ///< rows [0, F) of a gate_up tensor
  kUp,     ///< rows [F, 2 F)
};

/// "whole", "q", "k", "v", "gate" or "up".
std::string_view fused_part_name(FusedPart part) noexcept;

/// Rows [offset, offset + rows) of a tensor of `total` rows: a slot's share of its tensor.
struct FusedRows {
  std::int64_t offset = 0;
  std::int64_t rows = 0;
  std::int64_t total = 0;
};

/// The rows `part` covers in its fused tensor, for q_rows = heads * head_dim, kv_rows =
/// kv_heads * head_dim and the MLP's intermediate size `ffn`; for kWhole, `whole_rows` (all of
/// them).
FusedRows fused_rows(FusedPart part, std::int64_t q_rows, std::int64_t kv_rows, std::int64_t ffn,
                     std::int64_t whole_rows) noexcept;

/// One weight's Hugging Face tensor name. `slot` is numesh's name for the weight, as
/// ops::ShardedTransformer::weights() and ops::LmTrainingStep::parameters() give it, with "{L}"
/// for the layer ("layers.{L}.attention.wq", "embedding.table"); `hf` is the checkpoint
/// tensor's name with "{L}" for the layer and, for a stacked expert weight, "{E}" for the
/// expert (one tensor per expert); `gguf` is the tensor's name in a GGUF file, as llama.cpp's
/// converter writes it, with "{L}" for the layer ("blk.{L}.attn_q.weight"; a stacked expert
/// weight is one GGUF tensor [E, out, in] for all experts, "blk.{L}.ffn_gate_exps.weight").
struct TensorPattern {
  std::string_view slot;
  std::string_view hf;
  std::string_view gguf;
  FusedPart fused = FusedPart::kWhole;
};

/// How an architecture's MoE layers are configured in config.json.
struct MoeSpec {
  /// The number of experts: "num_local_experts" (Mixtral) or "num_experts" (Qwen-MoE).
  std::string_view num_experts_field{};
  /// Each expert's intermediate size: "intermediate_size" (Mixtral, which has no dense layers)
  /// or "moe_intermediate_size" (Qwen-MoE).
  std::string_view expert_ffn_field{};
  /// The top-k probabilities are always renormalised (Mixtral); otherwise norm_topk_prob says.
  bool always_renormalize = false;
  /// decoder_sparse_step and mlp_only_layers are read (Qwen-MoE: some layers may be dense).
  bool sparse_layer_fields = false;
  /// Every MoE layer has a sigmoid-gated shared expert, shared_expert_intermediate_size wide
  /// (Qwen2-MoE; transformers' default 5632).
  bool shared_expert = false;
  /// The norm_topk_prob a GGUF file's config takes, as llama.cpp's architecture decides it
  /// whatever expert_weights_norm says (its own saver writes that key for every architecture):
  /// Qwen3-MoE renormalises, Qwen2-MoE does not (Mixtral's always_renormalize decides alone).
  bool gguf_norm_topk_prob = false;
};

/// One architecture, as data. Entries are static: architecture_spec() returns references that
/// stay valid for the program's life. Thread-safety: immutable, safe to share.
struct ArchitectureSpec {
  Architecture architecture = Architecture::kLlama;
  /// The config.json model_type strings it answers to; the first is to_string(architecture).
  std::vector<std::string_view> model_types{};
  /// GGUF's general.architecture for it ("llama", "qwen2", "qwen3", "qwen2moe", "qwen3moe";
  /// Mistral and Mixtral are "llama" in GGUF, Mixtral's experts telling them apart).
  std::string_view gguf_name{};
  /// Every weight the architecture can have, once: its optional ones (biases, q/k norms) are
  /// in the checkpoint only when HfConfig says the model has them.
  std::vector<TensorPattern> tensors{};

  /// The MLP of the dense layers and of the experts, and the activation it takes from
  /// config.json's `activation_field` (config files saying otherwise are refused; absent or
  /// null: this one). Gemma's MLPs read hidden_activation, as transformers' GemmaMLP does,
  /// whatever hidden_act says.
  ops::MlpKind mlp_kind = ops::MlpKind::kSwiGLU;
  std::string_view hidden_act = "silu";
  std::string_view activation_field = "hidden_act";
  /// q, k and v projections always have biases, whatever attention_bias says (Qwen2,
  /// Qwen2-MoE: transformers builds them with bias=True).
  bool qkv_bias = false;
  /// config.json's mlp_bias is honoured (Llama); the other architectures' MLPs are built
  /// without biases whatever the field says (transformers' MistralMLP, Qwen2MLP, ...).
  bool mlp_bias_field = false;
  /// RMSNorm over head_dim on q and k before RoPE (Qwen3, Qwen3-MoE).
  bool qk_norm = false;
  /// Added to the blocks' and the final RMSNorm's weights as they scale (Gemma: 1, its norms
  /// multiplying by 1 + w): TransformerConfig::norm_weight_offset. llama.cpp's converter writes
  /// the weights with it added (GGUF norms hold 1 + w), and reading a GGUF file takes it off.
  float norm_offset = 0.0f;
  EmbeddingScale embedding_scale = EmbeddingScale::kNone;
  SlidingWindowRule sliding_window = SlidingWindowRule::kNever;
  /// config.json defaults: head_dim (0: hidden_size / num_attention_heads; Qwen3: 128; Gemma:
  /// 256), rms_norm_eps and rope_theta (Mixtral: 1e-5, 1e6), tie_word_embeddings (Gemma: true).
  std::int64_t default_head_dim = 0;
  double default_rms_norm_eps = 1e-6;
  double default_rope_theta = 10000.0;
  bool default_tie_word_embeddings = false;
  /// Set for the MoE architectures (Mixtral, Qwen2-MoE, Qwen3-MoE).
  std::optional<MoeSpec> moe{};
  /// llama.cpp's converter permutes the rows of q_proj and k_proj (and their biases) within each
  /// head, from Hugging Face's rotate-half RoPE layout to GGML's interleaved pairs: GGUF row
  /// h * head_dim + 2 j + s holds Hugging Face row h * head_dim + s * head_dim / 2 + j (Llama,
  /// Mistral, Mixtral; the Qwen converters write the rows as they are). Reading a GGUF file
  /// undoes it.
  bool gguf_permutes_qk = false;
  /// llama.cpp's architecture has an output.weight (Gemma's has none: its head is always the
  /// embedding, so an untied model cannot be written for it).
  bool gguf_has_output = true;
  /// llama.cpp's converter writes {arch}.rope.freq_base (Gemma's writes none, its reader taking
  /// 10000: numesh writes it then only for another theta).
  bool gguf_rope_base = true;
  /// llama.cpp's architecture reads {arch}.attention.sliding_window (Phi-3): the window goes in
  /// that key and context_length is max_position_embeddings. Elsewhere (Mistral) GGUF has no
  /// window, and numesh writes the window as the context length.
  bool gguf_sliding_window = false;
  /// llama.cpp's converter writes {arch}.vocab_size (the Llama family's converter alone).
  bool gguf_vocab_size = false;
  /// llama.cpp's converter writes {arch}.rope.dimension_count (the Llama family's, Phi-3's).
  bool gguf_rope_dimension_count = false;
  /// The architecture a GGUF file of this gguf_name with experts (expert_count > 0) is: "llama"
  /// files with experts are Mixtral's. Set on the first spec of a gguf_name only.
  std::optional<Architecture> gguf_with_experts{};

  /// The entry for `slot` (with "{L}", as TensorPattern::slot), or nullptr when the
  /// architecture has no such weight. Complexity: linear in the table (a few dozen entries).
  [[nodiscard]] const TensorPattern* find(std::string_view slot) const noexcept;
  /// The Hugging Face name of `slot` (with "{L}") for layer `layer` and, for a stacked expert
  /// weight, expert `expert` ("model.layers.3.self_attn.q_proj.weight").
  /// Throws: KeyError naming the slot when the architecture has no such weight; ValueError
  /// when the pattern takes an expert and `expert` is negative.
  [[nodiscard]] std::string hf_name(std::string_view slot, std::int64_t layer = -1,
                                    std::int64_t expert = -1) const;
  /// The GGUF name of `slot` (with "{L}") for layer `layer` ("blk.3.attn_q.weight"; for a
  /// stacked expert weight the one tensor holding every expert).
  /// Throws: KeyError naming the slot when the architecture has no such weight.
  [[nodiscard]] std::string gguf_name_of(std::string_view slot, std::int64_t layer = -1) const;
};

/// True for the slots ArchitectureSpec::norm_offset applies to: "layers.{L}.attn_norm",
/// "layers.{L}.ffn_norm" and "final_norm" (not the attention's q/k norms).
bool takes_norm_offset(std::string_view slot) noexcept;

/// Every architecture numesh reads, in Architecture's order.
std::span<const ArchitectureSpec> architecture_specs() noexcept;

/// The spec of `architecture`. REQUIRES: a value of the enum (others are a bug: debug abort).
const ArchitectureSpec& architecture_spec(Architecture architecture) noexcept;

/// The spec answering to config.json's `model_type`; `source` names the file in errors.
/// Throws: ValueError "<source>: model_type '<model_type>' is not an architecture numesh reads
/// (it reads llama, mistral, ...)" for any other string.
const ArchitectureSpec& architecture_spec(std::string_view model_type, std::string_view source);

}  // namespace numesh::models
