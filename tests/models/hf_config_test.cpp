// config.json as numesh reads it (numesh/models/hf/hf_config.hpp): the fields of real checkpoints'
// configs (the documents below follow the published config.json of each model, trimmed of
// fields numesh does not read), transformers' defaults for absent fields, the stacks they build,
// and every malformed field.

#include "numesh/models/hf/hf_config.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "numesh/core/error.hpp"

namespace numesh::models {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::StrEq;
using ::testing::ThrowsMessage;

// Llama 3.2 1B.
json llama32() {
  return json::parse(
      R"({"architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 128000,
    "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16", "vocab_size": 128256})");
}

// Mistral 7B v0.1.
json mistral() {
  return json::parse(
      R"({"architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 32768,
    "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
    "vocab_size": 32000})");
}

// Qwen2 0.5B.
json qwen2() {
  return json::parse(
      R"({"architectures": ["Qwen2ForCausalLM"], "bos_token_id": 151643, "eos_token_id": 151643,
    "hidden_act": "silu", "hidden_size": 896, "intermediate_size": 4864, "max_position_embeddings": 131072,
    "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072,
    "tie_word_embeddings": true, "use_sliding_window": false, "vocab_size": 151936})");
}

// Qwen3 0.6B.
json qwen3() {
  return json::parse(
      R"({"architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "bos_token_id": 151643,
    "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
    "sliding_window": null, "tie_word_embeddings": true, "use_sliding_window": false, "vocab_size": 151936})");
}

// Mixtral 8x7B.
json mixtral() {
  return json::parse(
      R"({"architectures": ["MixtralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 32768,
    "model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "num_local_experts": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02, "sliding_window": null, "tie_word_embeddings": false, "vocab_size": 32000})");
}

// Qwen3 30B-A3B.
json qwen3_moe() {
  return json::parse(
      R"({"architectures": ["Qwen3MoeForCausalLM"], "bos_token_id": 151643, "decoder_sparse_step": 1,
    "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 6144,
    "max_position_embeddings": 40960, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "tie_word_embeddings": false, "vocab_size": 151936})");
}

// Qwen1.5 MoE A2.7B.
json qwen2_moe() {
  return json::parse(
      R"({"architectures": ["Qwen2MoeForCausalLM"], "bos_token_id": 151643, "decoder_sparse_step": 1,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 5632,
    "max_position_embeddings": 8192, "model_type": "qwen2_moe", "moe_intermediate_size": 1408,
    "norm_topk_prob": false, "num_attention_heads": 16, "num_experts": 60, "num_experts_per_tok": 4,
    "num_hidden_layers": 24, "num_key_value_heads": 16, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "shared_expert_intermediate_size": 5632, "tie_word_embeddings": false, "vocab_size": 151936})");
}

TEST(HfConfigTest, Llama32ReadsEveryFieldAndBuildsItsStack) {
  const HfConfig c = HfConfig::parse(llama32(), "llama/config.json");
  EXPECT_EQ(c.architecture, Architecture::kLlama);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias || c.o_bias || c.mlp_bias || c.qk_norm);
  EXPECT_EQ(c.rope_scaling.kind, ops::RopeScaling::Kind::kLlama3);
  EXPECT_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_EQ(c.rope_scaling.original_max_position, 8192);
  EXPECT_EQ(c.bos_token_ids, std::vector<std::int64_t>{128000});
  EXPECT_EQ(c.eos_token_ids, std::vector<std::int64_t>{128001});
  EXPECT_EQ(c.max_context(), 131072);
  const ops::TransformerConfig t = c.transformer_config();
  EXPECT_EQ(t.hidden, 2048);
  EXPECT_EQ(t.layers, 16);
  EXPECT_EQ(t.ffn, 8192);
  EXPECT_EQ(t.attention.num_heads, 32);
  EXPECT_EQ(t.attention.num_kv_heads, 8);
  EXPECT_EQ(t.attention.head_dim, 64);
  EXPECT_EQ(t.attention.rope_theta, 500000.0f);
  EXPECT_EQ(t.attention.rope_scaling.kind, ops::RopeScaling::Kind::kLlama3);
  EXPECT_EQ(t.norm_eps, 1e-5f);
  EXPECT_EQ(t.moe_every, 0);
}

TEST(HfConfigTest, AbsentOptionalFieldsTakeTransformersDefaults) {
  json j = llama32();
  for (const char* key :
       {"num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling",
        "tie_word_embeddings", "max_position_embeddings", "hidden_act", "bos_token_id"}) {
    j.erase(key);
  }
  const HfConfig c = HfConfig::parse(j, "config.json");
  EXPECT_EQ(c.num_key_value_heads, 32) << "kv heads default to the heads";
  EXPECT_EQ(c.head_dim, 64) << "hidden / heads";
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rope_scaling.kind, ops::RopeScaling::Kind::kNone);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_TRUE(c.bos_token_ids.empty());
  json q = qwen3();
  q.erase("head_dim");
  EXPECT_EQ(HfConfig::parse(q, "config.json").head_dim, 128)
      << "Qwen3's default, not hidden / heads (64)";
  json linear = llama32();
  linear["rope_scaling"] = json{{"type", "linear"}, {"factor", 2.0}};  // the older key
  EXPECT_EQ(HfConfig::parse(linear, "config.json").rope_scaling.kind,
            ops::RopeScaling::Kind::kLinear);
  json eos_list = llama32();
  eos_list["eos_token_id"] = json::array({128001, 128008, 128009});
  EXPECT_EQ(HfConfig::parse(eos_list, "config.json").eos_token_ids,
            (std::vector<std::int64_t>{128001, 128008, 128009}));
}

TEST(HfConfigTest, MistralsSlidingWindowBoundsTheContext) {
  const HfConfig c = HfConfig::parse(mistral(), "config.json");
  EXPECT_EQ(c.architecture, Architecture::kMistral);
  ASSERT_TRUE(c.sliding_window.has_value());
  EXPECT_EQ(*c.sliding_window, 4096);
  EXPECT_EQ(c.max_context(), 4096);
  EXPECT_EQ(c.transformer_config().ffn, 14336);
  // Qwen2 names a window but does not use it unless use_sliding_window is true.
  EXPECT_FALSE(HfConfig::parse(qwen2(), "config.json").sliding_window.has_value());
}

TEST(HfConfigTest, MoeArchitecturesRouteAsTheirModelsDo) {
  const HfConfig mx = HfConfig::parse(mixtral(), "config.json");
  EXPECT_EQ(mx.num_experts, 8);
  EXPECT_EQ(mx.num_experts_per_tok, 2);
  EXPECT_EQ(mx.moe_intermediate_size, 14336) << "Mixtral's experts are intermediate_size wide";
  EXPECT_TRUE(mx.norm_topk_prob) << "Mixtral renormalises its top-k";
  EXPECT_TRUE(mx.is_moe_layer(0));
  EXPECT_TRUE(mx.is_moe_layer(31));
  const ops::TransformerConfig t = mx.transformer_config();
  EXPECT_EQ(t.moe_every, 1);
  EXPECT_EQ(t.moe.num_experts, 8);
  EXPECT_EQ(t.moe.top_k, 2);
  EXPECT_TRUE(t.moe.renormalize);
  EXPECT_EQ(t.moe_ffn, 14336);
  EXPECT_EQ(t.moe.capacity_factor, 0.0f) << "dropless, as the model runs";

  const HfConfig q3 = HfConfig::parse(qwen3_moe(), "config.json");
  EXPECT_EQ(q3.num_experts, 128);
  EXPECT_EQ(q3.moe_intermediate_size, 768);
  EXPECT_TRUE(q3.norm_topk_prob);
  EXPECT_TRUE(q3.qk_norm);
  json sparse = qwen3_moe();
  sparse["decoder_sparse_step"] = 2;
  sparse["mlp_only_layers"] = json::array({3});
  const HfConfig s = HfConfig::parse(sparse, "config.json");
  EXPECT_FALSE(s.is_moe_layer(0));
  EXPECT_TRUE(s.is_moe_layer(1));
  EXPECT_FALSE(s.is_moe_layer(3)) << "mlp_only_layers wins";
  EXPECT_EQ(s.intermediate_size, 6144) << "the dense layers' size";

  const HfConfig q2 = HfConfig::parse(qwen2_moe(), "config.json");
  EXPECT_EQ(q2.shared_expert_intermediate_size, 5632);
  EXPECT_FALSE(q2.norm_topk_prob);
  EXPECT_TRUE(q2.qkv_bias);
}

TEST(HfConfigTest, QwenBiasesAndQkNormsBuildTheirStacks) {
  const ops::TransformerConfig q2 = HfConfig::parse(qwen2(), "config.json").transformer_config();
  EXPECT_EQ(q2.attention.num_heads, 14);
  EXPECT_EQ(q2.attention.head_dim, 64);
  const ops::TransformerConfig q3 = HfConfig::parse(qwen3(), "config.json").transformer_config();
  EXPECT_EQ(q3.attention.head_dim, 128);
  EXPECT_EQ(q3.attention.qk_norm_eps, 1e-6f) << "Qwen3's q/k norms use rms_norm_eps";
  EXPECT_EQ(HfConfig::parse(qwen3_moe(), "config.json").transformer_config().moe.top_k, 8);
}

// google/gemma-2b's config.json (its published fields): GeGLU from hidden_activation (hidden_act
// "gelu" is not what transformers' GemmaMLP reads), norms of 1 + w, the embedding times
// sqrt(2048), head_dim 256, one kv head, tied by default.
TEST(HfConfigTest, GemmasConfigBuildsItsStack) {
  json j = {{"architectures", {"GemmaForCausalLM"}},
            {"model_type", "gemma"},
            {"bos_token_id", 2},
            {"eos_token_id", 1},
            {"pad_token_id", 0},
            {"head_dim", 256},
            {"hidden_act", "gelu"},
            {"hidden_activation", nullptr},
            {"hidden_size", 2048},
            {"intermediate_size", 16384},
            {"max_position_embeddings", 8192},
            {"num_attention_heads", 8},
            {"num_hidden_layers", 18},
            {"num_key_value_heads", 1},
            {"rms_norm_eps", 1e-06},
            {"rope_theta", 10000.0},
            {"vocab_size", 256000}};
  const HfConfig c = HfConfig::parse(j, "config.json");
  EXPECT_EQ(c.architecture, Architecture::kGemma);
  EXPECT_TRUE(c.tie_word_embeddings) << "GemmaConfig ties by default";
  EXPECT_EQ(c.embedding_scale(), std::sqrt(2048.0f));
  const ops::TransformerConfig t = c.transformer_config();
  EXPECT_EQ(t.mlp_kind, ops::MlpKind::kGeGLU);
  EXPECT_EQ(t.norm_weight_offset, 1.0f);
  EXPECT_EQ(t.attention.head_dim, 256);
  EXPECT_EQ(t.attention.num_kv_heads, 1);
  j["hidden_activation"] = "gelu_pytorch_tanh";
  EXPECT_EQ(HfConfig::parse(j, "config.json").transformer_config().mlp_kind, ops::MlpKind::kGeGLU);
  j.erase("head_dim");
  EXPECT_EQ(HfConfig::parse(j, "config.json").head_dim, 256) << "GemmaConfig's default";
  j["tie_word_embeddings"] = false;
  EXPECT_FALSE(HfConfig::parse(j, "config.json").tie_word_embeddings);
  j["hidden_activation"] = "gelu";  // the exact GELU: not Gemma's MLP
  EXPECT_THAT([&] { (void)HfConfig::parse(j, "m/config.json"); },
              ThrowsMessage<ValueError>(StrEq("m/config.json: hidden_activation 'gelu': gemma's "
                                              "MLPs are geglu (gelu_pytorch_tanh)")));
  // The other architectures scale nothing.
  EXPECT_EQ(HfConfig::parse(llama32(), "config.json").embedding_scale(), 1.0f);
  EXPECT_EQ(HfConfig::parse(llama32(), "config.json").transformer_config().norm_weight_offset,
            0.0f);
}

// microsoft/Phi-3-mini-4k-instruct's config.json: Llama's block (its fused tensors are the
// loader's), its sliding window bounding the context; Phi-3's 128k variants (longrope) and
// partial rotary embeddings (Phi-4-mini) refused by name.
TEST(HfConfigTest, Phi3sConfigBuildsItsStack) {
  json j = {{"architectures", {"Phi3ForCausalLM"}},
            {"model_type", "phi3"},
            {"attention_dropout", 0.0},
            {"bos_token_id", 1},
            {"embd_pdrop", 0.0},
            {"eos_token_id", 32000},
            {"hidden_act", "silu"},
            {"hidden_size", 3072},
            {"initializer_range", 0.02},
            {"intermediate_size", 8192},
            {"max_position_embeddings", 4096},
            {"num_attention_heads", 32},
            {"num_hidden_layers", 32},
            {"num_key_value_heads", 32},
            {"original_max_position_embeddings", 4096},
            {"pad_token_id", 32000},
            {"resid_pdrop", 0.0},
            {"rms_norm_eps", 1e-05},
            {"rope_scaling", nullptr},
            {"rope_theta", 10000.0},
            {"sliding_window", 2047},
            {"tie_word_embeddings", false},
            {"vocab_size", 32064}};
  const HfConfig c = HfConfig::parse(j, "config.json");
  EXPECT_EQ(c.architecture, Architecture::kPhi3);
  EXPECT_EQ(c.head_dim, 96);
  EXPECT_EQ(c.max_context(), 2047) << "the sliding window bounds the context";
  const ops::TransformerConfig t = c.transformer_config();
  EXPECT_EQ(t.mlp_kind, ops::MlpKind::kSwiGLU);
  EXPECT_EQ(t.norm_weight_offset, 0.0f);
  EXPECT_EQ(t.norm_eps, 1e-5f);
  json long_rope = j;
  long_rope["rope_scaling"] = {
      {"type", "longrope"}, {"long_factor", {1.0}}, {"short_factor", {1.0}}};
  EXPECT_THAT([&] { (void)HfConfig::parse(long_rope, "m/config.json"); },
              ThrowsMessage<ValueError>(HasSubstr("longrope")));
  j["partial_rotary_factor"] = 0.75;
  EXPECT_THAT([&] { (void)HfConfig::parse(j, "m/config.json"); },
              ThrowsMessage<NotImplementedError>(
                  StrEq("m/config.json: partial_rotary_factor 0.75: numesh rotates whole heads "
                        "(no partial rotary embedding)")));
  j["partial_rotary_factor"] = 1.0;
  EXPECT_NO_THROW((void)HfConfig::parse(j, "m/config.json"));
}

// Llama's MLP biases, Qwen2-MoE's shared expert and Qwen-MoE's mlp_only_layers: all run
// (nothing of the published configs is refused any more).
TEST(HfConfigTest, MlpBiasesSharedExpertsAndDenseLayersBuildTheirStacks) {
  json biases = llama32();
  biases["mlp_bias"] = true;
  const HfConfig lb = HfConfig::parse(biases, "config.json");
  EXPECT_TRUE(lb.mlp_bias);
  EXPECT_EQ(lb.transformer_config().ffn, 8192)
      << "the biases ride on the weights, the stack is Llama's";
  json mistral_bias = mistral();
  mistral_bias["mlp_bias"] = true;
  EXPECT_FALSE(HfConfig::parse(mistral_bias, "config.json").mlp_bias)
      << "MistralMLP has no biases whatever the field";

  const ops::TransformerConfig q2 =
      HfConfig::parse(qwen2_moe(), "config.json").transformer_config();
  EXPECT_EQ(q2.shared_expert_ffn, 5632);
  EXPECT_EQ(q2.moe_ffn, 1408);
  EXPECT_FALSE(q2.moe.renormalize) << "norm_topk_prob false: the raw softmax weights";
  EXPECT_TRUE(q2.dense_layers.empty());
  json absent = qwen2_moe();
  absent.erase("shared_expert_intermediate_size");
  EXPECT_EQ(HfConfig::parse(absent, "config.json").shared_expert_intermediate_size, 5632)
      << "transformers' default";
  EXPECT_EQ(HfConfig::parse(qwen3_moe(), "config.json").transformer_config().shared_expert_ffn, 0);

  json dense_layers = qwen2_moe();
  dense_layers["mlp_only_layers"] = json::array({5, 0, 5});
  const ops::TransformerConfig t =
      HfConfig::parse(dense_layers, "config.json").transformer_config();
  EXPECT_EQ(t.dense_layers, (std::vector<std::int64_t>{0, 5}))
      << "sorted, a repeat meaning nothing more";
  EXPECT_FALSE(t.is_moe(0));
  EXPECT_TRUE(t.is_moe(1));
  EXPECT_FALSE(t.is_moe(5));
  EXPECT_EQ(t.ffn, 5632) << "the dense layers' intermediate_size";
}

TEST(HfConfigTest, MalformedFieldsAreRefusedNamingFileAndField) {
  const auto refused = [](json j, const std::string& message) {
    EXPECT_THAT([&] { (void)HfConfig::parse(j, "m/config.json"); },
                ThrowsMessage<ValueError>(message))
        << message;
  };
  json j = llama32();
  j["model_type"] = "gpt2";
  refused(j,
          "m/config.json: model_type 'gpt2' is not an architecture numesh reads (it reads llama, "
          "mistral, "
          "qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, gemma, phi3)");
  j = llama32();
  j.erase("model_type");
  refused(j, "m/config.json: config field 'model_type' is missing");
  j = llama32();
  j["hidden_act"] = "gelu";
  refused(j, "m/config.json: hidden_act 'gelu': llama's MLPs are swiglu (silu)");
  j = llama32();
  j.erase("vocab_size");
  refused(j, "m/config.json: config field 'vocab_size' is missing");
  j = llama32();
  j["hidden_size"] = "2048";
  refused(j, "m/config.json: config field 'hidden_size' is \"2048\", expected an integer");
  j = llama32();
  j["num_hidden_layers"] = 0;
  refused(j, "m/config.json: config field 'num_hidden_layers' is 0, expected a positive integer");
  j = llama32();
  j["num_key_value_heads"] = 5;
  refused(j, "m/config.json: num_key_value_heads 5 does not divide num_attention_heads 32");
  j = llama32();
  j["head_dim"] = 63;
  refused(j, "m/config.json: head_dim 63 is odd; RoPE needs it even");
  j = llama32();
  j["rope_scaling"] = json{{"rope_type", "yarn"}, {"factor", 4.0}};
  refused(j,
          "m/config.json: rope_scaling type 'yarn' is not one numesh implements (linear, llama3, "
          "default)");
  j = llama32();
  j["rope_scaling"].erase("low_freq_factor");
  refused(j, "m/config.json: rope_scaling 'llama3' has no 'low_freq_factor'");
  j = llama32();
  j["rope_scaling"]["factor"] = 0.0;
  refused(j, "m/config.json: rope scaling llama3: factor 0 must be positive");
  j = llama32();
  j["rope_scaling"] = "llama3";
  refused(j,
          "m/config.json: config field 'rope_scaling' is \"llama3\", expected an object or null");
  j = llama32();
  j["tie_word_embeddings"] = 1;
  refused(j, "m/config.json: config field 'tie_word_embeddings' is 1, expected true or false");
  j = llama32();
  j["eos_token_id"] = 128256;
  refused(j, "m/config.json: token id 128256 is outside the vocabulary of 128256");
  j = llama32();
  j["bos_token_id"] = json::array({1, "two"});
  refused(j,
          "m/config.json: config field 'bos_token_id' holds [1,\"two\"], expected non-negative "
          "token ids");
  j = mixtral();
  j["num_experts_per_tok"] = 9;
  refused(j, "m/config.json: num_experts_per_tok 9 is more than the 8 experts");
  j = qwen3_moe();
  j["mlp_only_layers"] = json::array({48});
  refused(j, "m/config.json: mlp_only_layers names layer 48, outside the 48 layers");
  j = qwen2_moe();
  j["shared_expert_intermediate_size"] = 0;
  refused(j,
          "m/config.json: config field 'shared_expert_intermediate_size' is 0, expected a positive "
          "integer");
  j = qwen3_moe();
  j.erase("moe_intermediate_size");
  refused(j, "m/config.json: config field 'moe_intermediate_size' is missing");
  refused(json::array({1, 2}), "m/config.json: a config.json holds a JSON object, not array");
}

TEST(HfConfigTest, LoadReadsAFileOrAFolderAndNamesWhatItCannotRead) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "numesh_hf_config_test";
  std::filesystem::create_directories(dir);
  { std::ofstream(dir / "config.json") << llama32().dump(); }
  EXPECT_EQ(HfConfig::load(dir).hidden_size, 2048);
  EXPECT_EQ(HfConfig::load(dir / "config.json").vocab_size, 128256);
  EXPECT_THAT(
      [&] { (void)HfConfig::load(dir / "missing.json"); },
      ThrowsMessage<IoError>((dir / "missing.json").string() +
                             " does not exist (expected a model folder holding config.json, or a "
                             "config.json file)"));
  std::filesystem::create_directories(dir / "empty");
  EXPECT_THAT([&] { (void)HfConfig::load(dir / "empty"); },
              ThrowsMessage<IoError>("cannot read " + (dir / "empty" / "config.json").string()));
  { std::ofstream(dir / "broken.json") << "{\"model_type\": "; }
  EXPECT_THAT([&] { (void)HfConfig::load(dir / "broken.json"); },
              ThrowsMessage<IoError>(HasSubstr((dir / "broken.json").string() + " is not JSON: ")));
  // A number beyond double is nlohmann's out_of_range, not a parse_error: still an IoError.
  { std::ofstream(dir / "huge.json") << "{\"rope_theta\": 1e999}"; }
  EXPECT_THAT(
      [&] { (void)HfConfig::load(dir / "huge.json"); },
      ThrowsMessage<IoError>(HasSubstr("huge.json is not JSON: [json.exception.out_of_range.406] "
                                       "number overflow parsing '1e999'")));
  // generation_config.json beside it: its special ids win (Llama 3 Instruct's end-of-turn ids).
  {
    std::ofstream(dir / "generation_config.json")
        << R"({"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]})";
  }
  EXPECT_EQ(HfConfig::load(dir).eos_token_ids, (std::vector<std::int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(HfConfig::load(dir / "config.json").bos_token_ids, (std::vector<std::int64_t>{128000}));
  { std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": 999999})"; }
  EXPECT_THAT([&] { (void)HfConfig::load(dir); },
              ThrowsMessage<ValueError>((dir / "generation_config.json").string() +
                                        ": token id 999999 is outside the vocabulary of 128256"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace numesh::models
