// The architectures as data (ArchitectureSpec): every architecture's names and properties, the
// lookups by model_type and by Architecture, and the refusals; the names reaching
// hf_tensor_name / hf_tensor_parts and the MLP kind reaching HfConfig's TransformerConfig.

#include "numesh/models/hf/architecture_spec.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "numesh/core/error.hpp"
#include "numesh/models/hf/hf_config.hpp"
#include "numesh/models/hf/hf_weights.hpp"

namespace numesh::models {
namespace {

using ::testing::ThrowsMessage;

// What each architecture is: its names and its quirks, one row each.
struct Expected {
  Architecture architecture;
  const char* model_type;
  const char* gguf_name;
  bool qkv_bias, mlp_bias_field, qk_norm, moe, shared_expert;
  std::int64_t default_head_dim;
  SlidingWindowRule sliding_window;
  const char* router;       // layer 3's router, "" without MoE
  const char* expert_down;  // layer 3, expert 5's down projection, "" without MoE
};

const std::vector<Expected>& expected() {
  static const std::vector<Expected> kRows = {
      {Architecture::kLlama, "llama", "llama", false, true, false, false, false, 0,
       SlidingWindowRule::kNever, "", ""},
      {Architecture::kMistral, "mistral", "llama", false, false, false, false, false, 0,
       SlidingWindowRule::kWhenSet, "", ""},
      {Architecture::kQwen2, "qwen2", "qwen2", true, false, false, false, false, 0,
       SlidingWindowRule::kUseSlidingWindow, "", ""},
      {Architecture::kQwen3, "qwen3", "qwen3", false, false, true, false, false, 128,
       SlidingWindowRule::kUseSlidingWindow, "", ""},
      {Architecture::kMixtral, "mixtral", "llama", false, false, false, true, false, 0,
       SlidingWindowRule::kWhenSet, "model.layers.3.block_sparse_moe.gate.weight",
       "model.layers.3.block_sparse_moe.experts.5.w2.weight"},
      {Architecture::kQwen2Moe, "qwen2_moe", "qwen2moe", true, false, false, true, true, 0,
       SlidingWindowRule::kUseSlidingWindow, "model.layers.3.mlp.gate.weight",
       "model.layers.3.mlp.experts.5.down_proj.weight"},
      {Architecture::kQwen3Moe, "qwen3_moe", "qwen3moe", false, false, true, true, false, 128,
       SlidingWindowRule::kUseSlidingWindow, "model.layers.3.mlp.gate.weight",
       "model.layers.3.mlp.experts.5.down_proj.weight"},
      {Architecture::kGemma, "gemma", "gemma", false, false, false, false, false, 256,
       SlidingWindowRule::kNever, "", ""},
      {Architecture::kPhi3, "phi3", "phi3", false, false, false, false, false, 0,
       SlidingWindowRule::kWhenSet, "", ""},
  };
  return kRows;
}

TEST(ArchitectureSpecTest, EveryArchitectureHasItsNamesAndProperties) {
  ASSERT_EQ(architecture_specs().size(), expected().size());
  for (std::size_t i = 0; i < expected().size(); ++i) {
    const Expected& want = expected()[i];
    const ArchitectureSpec& s = architecture_spec(want.architecture);
    SCOPED_TRACE(want.model_type);
    EXPECT_EQ(&architecture_specs()[i], &s) << "in Architecture's order";
    EXPECT_EQ(s.architecture, want.architecture);
    EXPECT_EQ(s.model_types, (std::vector<std::string_view>{want.model_type}));
    EXPECT_EQ(to_string(want.architecture), want.model_type);
    EXPECT_EQ(&architecture_spec(want.model_type, "config.json"), &s);
    EXPECT_EQ(s.gguf_name, want.gguf_name);
    // Gemma's block differs in its MLP, its norms and its embedding; the others are Llama's.
    const bool gemma = want.architecture == Architecture::kGemma;
    EXPECT_EQ(s.mlp_kind, gemma ? ops::MlpKind::kGeGLU : ops::MlpKind::kSwiGLU);
    EXPECT_EQ(s.hidden_act, gemma ? "gelu_pytorch_tanh" : "silu");
    EXPECT_EQ(s.activation_field, gemma ? "hidden_activation" : "hidden_act");
    EXPECT_EQ(s.default_tie_word_embeddings, gemma);
    EXPECT_EQ(s.gguf_has_output, !gemma);
    EXPECT_EQ(s.qkv_bias, want.qkv_bias);
    EXPECT_EQ(s.mlp_bias_field, want.mlp_bias_field);
    EXPECT_EQ(s.qk_norm, want.qk_norm);
    EXPECT_EQ(s.norm_offset, gemma ? 1.0f : 0.0f);
    EXPECT_EQ(s.embedding_scale, gemma ? EmbeddingScale::kSqrtHidden : EmbeddingScale::kNone);
    EXPECT_EQ(s.sliding_window, want.sliding_window);
    EXPECT_EQ(s.default_head_dim, want.default_head_dim);
    EXPECT_EQ(s.moe.has_value(), want.moe);
    EXPECT_EQ(s.moe && s.moe->shared_expert, want.shared_expert);

    // The names every architecture shares (Llama's), then the ones that differ.
    EXPECT_EQ(s.hf_name("embedding.table"), "model.embed_tokens.weight");
    EXPECT_EQ(s.hf_name("final_norm"), "model.norm.weight");
    EXPECT_EQ(s.hf_name("lm_head.weight"), "lm_head.weight");
    EXPECT_EQ(s.hf_name("layers.{L}.attn_norm", 3), "model.layers.3.input_layernorm.weight");
    EXPECT_EQ(s.hf_name("layers.{L}.ffn_norm", 3),
              "model.layers.3.post_attention_layernorm.weight");
    // Phi-3 fuses q, k and v into qkv_proj, gate and up into gate_up_proj (below).
    const bool phi3 = want.architecture == Architecture::kPhi3;
    for (const char* p : {"q", "k", "v", "o"}) {
      EXPECT_EQ(s.hf_name(std::string("layers.{L}.attention.w") + p, 3),
                std::string("model.layers.3.self_attn.") + (phi3 && *p != 'o' ? "qkv" : p) +
                    "_proj.weight");
      EXPECT_EQ(s.hf_name(std::string("layers.{L}.attention.b") + p, 3),
                std::string("model.layers.3.self_attn.") + p + "_proj.bias");
    }
    EXPECT_EQ(s.find("layers.{L}.attention.q_norm") != nullptr, want.qk_norm);
    if (want.qk_norm) {
      EXPECT_EQ(s.hf_name("layers.{L}.attention.k_norm", 3),
                "model.layers.3.self_attn.k_norm.weight");
    }
    EXPECT_EQ(s.find("layers.{L}.mlp.up_bias") != nullptr, want.mlp_bias_field);
    // Every architecture but Mixtral can have dense layers (Qwen-MoE's mlp_only_layers).
    EXPECT_EQ(s.find("layers.{L}.mlp.gate") != nullptr,
              want.architecture != Architecture::kMixtral);
    if (want.moe) {
      EXPECT_EQ(s.hf_name("layers.{L}.moe.router", 3), want.router);
      EXPECT_EQ(s.hf_name("layers.{L}.moe.down", 3, 5), want.expert_down);
    } else {
      EXPECT_EQ(s.find("layers.{L}.moe.router"), nullptr);
    }
    EXPECT_EQ(s.find("layers.{L}.moe.shared_expert_gate") != nullptr, want.shared_expert);
    for (const TensorPattern& t : s.tensors) {
      if (!phi3) {
        EXPECT_EQ(t.fused, FusedPart::kWhole) << t.slot;
      }
      EXPECT_EQ(s.find(t.slot), &t) << t.slot << " is listed once";
    }
  }
  const ArchitectureSpec& mixtral = architecture_spec(Architecture::kMixtral);
  EXPECT_EQ(mixtral.hf_name("layers.{L}.moe.gate", 0, 1),
            "model.layers.0.block_sparse_moe.experts.1.w1.weight");
  EXPECT_EQ(mixtral.hf_name("layers.{L}.moe.up", 0, 1),
            "model.layers.0.block_sparse_moe.experts.1.w3.weight");
  EXPECT_EQ(mixtral.moe->num_experts_field, "num_local_experts");
  EXPECT_EQ(mixtral.moe->expert_ffn_field, "intermediate_size");
  EXPECT_TRUE(mixtral.moe->always_renormalize);
  EXPECT_FALSE(mixtral.moe->sparse_layer_fields);
  EXPECT_EQ(mixtral.default_rms_norm_eps, 1e-5);
  EXPECT_EQ(mixtral.default_rope_theta, 1e6);
  const ArchitectureSpec& qwen2_moe = architecture_spec(Architecture::kQwen2Moe);
  EXPECT_EQ(qwen2_moe.hf_name("layers.{L}.moe.gate", 2, 0),
            "model.layers.2.mlp.experts.0.gate_proj.weight");
  EXPECT_EQ(qwen2_moe.hf_name("layers.{L}.moe.shared_expert.up", 2),
            "model.layers.2.mlp.shared_expert.up_proj.weight");
  EXPECT_EQ(qwen2_moe.hf_name("layers.{L}.moe.shared_expert_gate", 2),
            "model.layers.2.mlp.shared_expert_gate.weight");
  EXPECT_EQ(qwen2_moe.moe->num_experts_field, "num_experts");
  EXPECT_EQ(qwen2_moe.moe->expert_ffn_field, "moe_intermediate_size");
  EXPECT_TRUE(qwen2_moe.moe->sparse_layer_fields);
  EXPECT_FALSE(qwen2_moe.moe->always_renormalize);
}

TEST(ArchitectureSpecTest, UnknownNamesAndSlotsAreRefusedByName) {
  EXPECT_THAT([] { (void)architecture_spec("gpt2", "m/config.json"); },
              ThrowsMessage<ValueError>(
                  "m/config.json: model_type 'gpt2' is not an architecture numesh reads (it reads "
                  "llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, gemma, phi3)"));
  EXPECT_THAT([] { (void)architecture_spec("Llama", "m/config.json"); },
              ThrowsMessage<ValueError>(::testing::HasSubstr("model_type 'Llama' is not")))
      << "model_type is matched exactly, as transformers does";
  const ArchitectureSpec& llama = architecture_spec(Architecture::kLlama);
  EXPECT_THAT([&] { (void)llama.hf_name("layers.{L}.moe.router", 0); },
              ThrowsMessage<KeyError>("llama has no weight 'layers.{L}.moe.router'"));
  const ArchitectureSpec& mixtral = architecture_spec(Architecture::kMixtral);
  EXPECT_THAT([&] { (void)mixtral.hf_name("layers.{L}.moe.gate", 0); },
              ThrowsMessage<ValueError>("mixtral: weight 'layers.{L}.moe.gate' "
                                        "(model.layers.{L}.block_sparse_moe.experts.{E}.w1.weight) "
                                        "is one tensor per expert"));
  EXPECT_EQ(to_string(static_cast<Architecture>(200)), "?");
}

// The saver's names come from the same table: a dense slot's one tensor, a stacked expert
// weight's per-expert tensors, and a slot the architecture lacks refused.
TEST(ArchitectureSpecTest, SaversNamesComeFromTheSpec) {
  EXPECT_EQ(hf_tensor_name("layers.12.attention.wv", Architecture::kQwen2),
            "model.layers.12.self_attn.v_proj.weight");
  EXPECT_EQ(hf_tensor_name("layers.0.moe.router", Architecture::kMixtral),
            "model.layers.0.block_sparse_moe.gate.weight");
  EXPECT_THAT([] { (void)hf_tensor_name("layers.0.moe.up", Architecture::kMixtral); },
              ThrowsMessage<KeyError>(::testing::HasSubstr("hf_tensor_parts() names them")));
  EXPECT_THAT([] { (void)hf_tensor_name("layers.0.attention.q_norm", Architecture::kLlama); },
              ThrowsMessage<KeyError>(
                  "no Hugging Face tensor is known for the weight 'layers.0.attention.q_norm'"));
  EXPECT_THAT(
      [] { (void)hf_tensor_parts("layers.0.moe.shared_expert.up", Architecture::kQwen3Moe, 2); },
      ThrowsMessage<KeyError>(::testing::HasSubstr("'layers.0.moe.shared_expert.up'")))
      << "Qwen3-MoE has no shared expert";
  const std::vector<HfTensorPart> gate =
      hf_tensor_parts("layers.1.moe.shared_expert_gate", Architecture::kQwen2Moe, 4);
  ASSERT_EQ(gate.size(), 1u);
  EXPECT_EQ(gate[0].name, "model.layers.1.mlp.shared_expert_gate.weight");
  EXPECT_TRUE(gate[0].transposed);
  // Phi-3's fused tensors: each slot its slice, fused_rows() its rows (heads 32 of 96, kv heads
  // 8: q 3072 rows, k and v 768 each; an intermediate of 8192).
  const struct {
    const char* slot;
    const char* name;
    FusedPart part;
    FusedRows rows;
  } fused[] = {
      {"layers.2.attention.wq",
       "model.layers.2.self_attn.qkv_proj.weight",
       FusedPart::kQ,
       {0, 3072, 4608}},
      {"layers.2.attention.wk",
       "model.layers.2.self_attn.qkv_proj.weight",
       FusedPart::kK,
       {3072, 768, 4608}},
      {"layers.2.attention.wv",
       "model.layers.2.self_attn.qkv_proj.weight",
       FusedPart::kV,
       {3840, 768, 4608}},
      {"layers.2.mlp.gate",
       "model.layers.2.mlp.gate_up_proj.weight",
       FusedPart::kGate,
       {0, 8192, 16384}},
      {"layers.2.mlp.up",
       "model.layers.2.mlp.gate_up_proj.weight",
       FusedPart::kUp,
       {8192, 8192, 16384}},
      {"layers.2.mlp.down",
       "model.layers.2.mlp.down_proj.weight",
       FusedPart::kWhole,
       {0, 3072, 3072}},
  };
  for (const auto& f : fused) {
    const std::vector<HfTensorPart> parts = hf_tensor_parts(f.slot, Architecture::kPhi3, 0);
    ASSERT_EQ(parts.size(), 1u) << f.slot;
    EXPECT_EQ(parts[0].name, f.name);
    EXPECT_EQ(parts[0].fused, f.part) << f.slot;
    EXPECT_FALSE(parts[0].transposed) << f.slot;
    const FusedRows r = fused_rows(f.part, 3072, 768, 8192, 3072);
    EXPECT_EQ(std::tuple(r.offset, r.rows, r.total),
              std::tuple(f.rows.offset, f.rows.rows, f.rows.total))
        << f.slot;
  }
}

// HfConfig takes the architecture's MLP kind into the stack it builds, and its quirks from
// the spec.
TEST(ArchitectureSpecTest, HfConfigTakesTheSpecsMlpKindAndQuirks) {
  nlohmann::json j = {{"model_type", "qwen2"},       {"vocab_size", 64},
                      {"hidden_size", 32},           {"intermediate_size", 64},
                      {"num_hidden_layers", 2},      {"num_attention_heads", 4},
                      {"use_sliding_window", false}, {"sliding_window", 16}};
  const HfConfig c = HfConfig::parse(j, "config.json");
  EXPECT_EQ(&c.spec(), &architecture_spec(Architecture::kQwen2));
  EXPECT_EQ(c.transformer_config().mlp_kind, ops::MlpKind::kSwiGLU);
  EXPECT_TRUE(c.qkv_bias) << "the spec's";
  EXPECT_FALSE(c.o_bias) << "attention_bias absent";
  EXPECT_FALSE(c.sliding_window) << "Qwen: only with use_sliding_window";
  j["use_sliding_window"] = true;
  EXPECT_EQ(HfConfig::parse(j, "config.json").sliding_window, 16);
}

// A GGUF name's variant with experts (Mixtral's "llama" files) hangs on the first spec of that
// name, which a reader meets first, and is an MoE spec of the same name; the keys only some of
// llama.cpp's converters write are where those converters write them.
TEST(ArchitectureSpecTest, GgufVariantsAndKeysAreData) {
  for (const ArchitectureSpec& s : architecture_specs()) {
    const ArchitectureSpec* first = nullptr;
    for (const ArchitectureSpec& t : architecture_specs()) {
      if (t.gguf_name == s.gguf_name) {
        first = &t;
        break;
      }
    }
    ASSERT_NE(first, nullptr);
    if (!s.gguf_with_experts) continue;
    EXPECT_EQ(first, &s) << to_string(s.architecture);
    const ArchitectureSpec& variant = architecture_spec(*s.gguf_with_experts);
    EXPECT_EQ(variant.gguf_name, s.gguf_name);
    EXPECT_TRUE(variant.moe.has_value());
    EXPECT_FALSE(s.moe.has_value());
  }
  EXPECT_EQ(architecture_spec(Architecture::kLlama).gguf_with_experts, Architecture::kMixtral);
  for (const Architecture a :
       {Architecture::kLlama, Architecture::kMistral, Architecture::kMixtral})
    EXPECT_TRUE(architecture_spec(a).gguf_vocab_size) << to_string(a);
  EXPECT_FALSE(architecture_spec(Architecture::kQwen2).gguf_vocab_size);
  EXPECT_TRUE(architecture_spec(Architecture::kPhi3).gguf_rope_dimension_count);
  EXPECT_FALSE(architecture_spec(Architecture::kGemma).gguf_rope_dimension_count);
  EXPECT_TRUE(architecture_spec(Architecture::kQwen3Moe).moe->gguf_norm_topk_prob);
  EXPECT_FALSE(architecture_spec(Architecture::kQwen2Moe).moe->gguf_norm_topk_prob);
}

}  // namespace
}  // namespace numesh::models
