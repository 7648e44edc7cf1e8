#include "numesh/models/hf/hf_config.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::models {

namespace {

using nlohmann::json;

// Typed reads of config.json fields, each error naming the file and the field.
class Fields {
 public:
  Fields(const json& j, std::string_view source) : j_(j), source_(source) {}

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  std::int64_t integer(const char* key) const {
    NUMESH_CHECK(has(key), ValueError, "{}: config field '{}' is missing", source_, key);
    const json& v = j_.at(key);
    NUMESH_CHECK(v.is_number_integer(), ValueError,
                 "{}: config field '{}' is {}, expected an integer", source_, key, v.dump());
    return v.get<std::int64_t>();
  }
  std::int64_t integer(const char* key, std::int64_t fallback) const {
    return has(key) ? integer(key) : fallback;
  }
  std::int64_t positive(const char* key) const { return check_positive(key, integer(key)); }
  std::int64_t positive(const char* key, std::int64_t fallback) const {
    return check_positive(key, integer(key, fallback));
  }

  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_.at(key);
    NUMESH_CHECK(v.is_number(), ValueError, "{}: config field '{}' is {}, expected a number",
                 source_, key, v.dump());
    return v.get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_.at(key);
    NUMESH_CHECK(v.is_boolean(), ValueError, "{}: config field '{}' is {}, expected true or false",
                 source_, key, v.dump());
    return v.get<bool>();
  }
  std::string text(const char* key) const {
    NUMESH_CHECK(has(key), ValueError, "{}: config field '{}' is missing", source_, key);
    const json& v = j_.at(key);
    NUMESH_CHECK(v.is_string(), ValueError, "{}: config field '{}' is {}, expected a string",
                 source_, key, v.dump());
    return v.get<std::string>();
  }
  // One id or a list of ids (bos_token_id, eos_token_id); empty when absent.
  std::vector<std::int64_t> ids(const char* key) const {
    if (!has(key)) return {};
    const json& v = j_.at(key);
    std::vector<std::int64_t> out;
    const auto take = [&](const json& e) {
      NUMESH_CHECK(e.is_number_integer() && e.get<std::int64_t>() >= 0, ValueError,
                   "{}: config field '{}' holds {}, expected non-negative token ids", source_, key,
                   v.dump());
      out.push_back(e.get<std::int64_t>());
    };
    if (v.is_array()) {
      for (const json& e : v) take(e);
    } else {
      take(v);
    }
    return out;
  }
  std::vector<std::int64_t> integers(const char* key) const {
    if (!has(key)) return {};
    const json& v = j_.at(key);
    NUMESH_CHECK(v.is_array(), ValueError,
                 "{}: config field '{}' is {}, expected a list of integers", source_, key,
                 v.dump());
    std::vector<std::int64_t> out;
    for (const json& e : v) {
      NUMESH_CHECK(e.is_number_integer(), ValueError,
                   "{}: config field '{}' is {}, expected a list of integers", source_, key,
                   v.dump());
      out.push_back(e.get<std::int64_t>());
    }
    return out;
  }
  const json& raw(const char* key) const { return j_.at(key); }
  std::string_view source() const { return source_; }

 private:
  std::int64_t check_positive(const char* key, std::int64_t v) const {
    NUMESH_CHECK(v > 0, ValueError, "{}: config field '{}' is {}, expected a positive integer",
                 source_, key, v);
    return v;
  }

  const json& j_;
  std::string_view source_;
};

// rope_scaling: null, or {"rope_type" (or the older "type"): "linear" | "llama3" | "default", ...}.
ops::RopeScaling rope_scaling_of(const Fields& f) {
  if (!f.has("rope_scaling")) return {};
  const json& r = f.raw("rope_scaling");
  NUMESH_CHECK(r.is_object(), ValueError,
               "{}: config field 'rope_scaling' is {}, expected an object or null", f.source(),
               r.dump());
  const Fields rf(r, f.source());
  const std::string type = rf.has("rope_type") ? rf.text("rope_type")
                           : rf.has("type")    ? rf.text("type")
                                               : "";
  ops::RopeScaling s;
  if (type == "default") return s;
  NUMESH_CHECK(type == "linear" || type == "llama3", ValueError,
               "{}: rope_scaling type '{}' is not one numesh implements (linear, llama3, default)",
               f.source(), type);
  NUMESH_CHECK(rf.has("factor"), ValueError, "{}: rope_scaling '{}' has no 'factor'", f.source(),
               type);
  if (type == "linear") {
    s = ops::RopeScaling::linear(rf.number("factor", 1.0));
  } else {
    for (const char* key :
         {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
      NUMESH_CHECK(rf.has(key), ValueError, "{}: rope_scaling 'llama3' has no '{}'", f.source(),
                   key);
    }
    s = ops::RopeScaling::llama3(rf.number("factor", 1.0), rf.number("low_freq_factor", 1.0),
                                 rf.number("high_freq_factor", 4.0),
                                 rf.integer("original_max_position_embeddings"));
  }
  try {
    ops::validate(s);
  } catch (const ValueError& e) {
    throw ValueError(fmt::format("{}: {}", f.source(), e.what()));
  }
  return s;
}

}  // namespace

const ArchitectureSpec& HfConfig::spec() const noexcept { return architecture_spec(architecture); }

bool HfConfig::is_moe_layer(std::int64_t i) const noexcept {
  if (num_experts == 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), i) != mlp_only_layers.end())
    return false;
  return (i + 1) % decoder_sparse_step == 0;
}

std::int64_t HfConfig::max_context() const noexcept {
  return sliding_window ? std::min(*sliding_window, max_position_embeddings)
                        : max_position_embeddings;
}

HfConfig HfConfig::parse(const json& config, std::string_view source) {
  NUMESH_CHECK(config.is_object(), ValueError, "{}: a config.json holds a JSON object, not {}",
               source, config.type_name());
  const Fields f(config, source);
  HfConfig c;
  const ArchitectureSpec& spec = architecture_spec(f.text("model_type"), source);
  c.architecture = spec.architecture;

  const std::string act_field(spec.activation_field);
  const std::string act =
      f.has(act_field.c_str()) ? f.text(act_field.c_str()) : std::string(spec.hidden_act);
  NUMESH_CHECK(act == spec.hidden_act, ValueError, "{}: {} '{}': {}'s MLPs are {} ({})", source,
               act_field, act, spec.model_types.front(), ops::to_string(spec.mlp_kind),
               spec.hidden_act);

  c.vocab_size = f.positive("vocab_size");
  c.hidden_size = f.positive("hidden_size");
  c.num_hidden_layers = f.positive("num_hidden_layers");
  c.num_attention_heads = f.positive("num_attention_heads");
  c.num_key_value_heads = f.positive("num_key_value_heads", c.num_attention_heads);
  NUMESH_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, ValueError,
               "{}: num_key_value_heads {} does not divide num_attention_heads {}", source,
               c.num_key_value_heads, c.num_attention_heads);
  // Qwen3's head_dim defaults to 128 in transformers; the others to hidden / heads.
  if (f.has("head_dim")) {
    c.head_dim = f.positive("head_dim");
  } else if (spec.default_head_dim > 0) {
    c.head_dim = spec.default_head_dim;
  } else {
    NUMESH_CHECK(
        c.hidden_size % c.num_attention_heads == 0, ValueError,
        "{}: hidden_size {} is not a multiple of num_attention_heads {} and no head_dim is given",
        source, c.hidden_size, c.num_attention_heads);
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  NUMESH_CHECK(c.head_dim % 2 == 0, ValueError, "{}: head_dim {} is odd; RoPE needs it even",
               source, c.head_dim);
  c.rms_norm_eps = f.number("rms_norm_eps", spec.default_rms_norm_eps);
  NUMESH_CHECK(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps >= 0.0, ValueError,
               "{}: rms_norm_eps {} must be a non-negative number", source, c.rms_norm_eps);
  c.rope_theta = f.number("rope_theta", spec.default_rope_theta);
  NUMESH_CHECK(std::isfinite(c.rope_theta) && c.rope_theta > 0.0, ValueError,
               "{}: rope_theta {} must be positive", source, c.rope_theta);
  c.rope_scaling = rope_scaling_of(f);
  // Phi-4-mini and others rotate part of each head; numesh rotates whole heads.
  if (f.has("partial_rotary_factor")) {
    const double part = f.number("partial_rotary_factor", 1.0);
    NUMESH_CHECK(part == 1.0, NotImplementedError,
                 "{}: partial_rotary_factor {}: numesh rotates whole heads (no partial rotary "
                 "embedding)",
                 source, part);
  }
  c.max_position_embeddings = f.positive("max_position_embeddings", 2048);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", spec.default_tie_word_embeddings);

  // Biases: some architectures' q, k, v projections always have them (no config field);
  // attention_bias puts them on all four projections. mlp_bias only where the architecture
  // honours it: the others' MLPs and experts are built without biases whatever the field says.
  const bool attention_bias = f.boolean("attention_bias", false);
  c.qkv_bias = spec.qkv_bias || attention_bias;
  c.o_bias = attention_bias;
  c.mlp_bias = f.boolean("mlp_bias", false) && spec.mlp_bias_field;
  c.qk_norm = spec.qk_norm;

  const bool windowed = spec.sliding_window == SlidingWindowRule::kWhenSet ||
                        (spec.sliding_window == SlidingWindowRule::kUseSlidingWindow &&
                         f.boolean("use_sliding_window", false));
  if (windowed && f.has("sliding_window")) c.sliding_window = f.positive("sliding_window");

  if (spec.moe) {
    const MoeSpec& moe = *spec.moe;
    c.num_experts = f.positive(std::string(moe.num_experts_field).c_str());
    c.num_experts_per_tok = f.positive("num_experts_per_tok");
    NUMESH_CHECK(c.num_experts_per_tok <= c.num_experts, ValueError,
                 "{}: num_experts_per_tok {} is more than the {} experts", source,
                 c.num_experts_per_tok, c.num_experts);
    c.moe_intermediate_size = f.positive(std::string(moe.expert_ffn_field).c_str());
    c.norm_topk_prob = moe.always_renormalize || f.boolean("norm_topk_prob", false);
    if (moe.sparse_layer_fields) {
      c.decoder_sparse_step = f.positive("decoder_sparse_step", 1);
      c.mlp_only_layers = f.integers("mlp_only_layers");
      for (std::int64_t l : c.mlp_only_layers) {
        NUMESH_CHECK(l >= 0 && l < c.num_hidden_layers, ValueError,
                     "{}: mlp_only_layers names layer {}, outside the {} layers", source, l,
                     c.num_hidden_layers);
      }
    }
    if (moe.shared_expert) {
      c.shared_expert_intermediate_size = f.positive("shared_expert_intermediate_size", 5632);
    }
  }
  bool dense_layers = !spec.moe;
  for (std::int64_t l = 0; l < c.num_hidden_layers && !dense_layers; ++l)
    dense_layers = !c.is_moe_layer(l);
  if (dense_layers) {
    c.intermediate_size = f.positive("intermediate_size");
  } else if (spec.moe->expert_ffn_field != "intermediate_size") {
    // Where intermediate_size is the experts' (Mixtral), there is no dense size to keep.
    c.intermediate_size = f.integer("intermediate_size", 0);
  }
  c.bos_token_ids = f.ids("bos_token_id");
  c.eos_token_ids = f.ids("eos_token_id");
  for (const auto* list : {&c.bos_token_ids, &c.eos_token_ids}) {
    for (std::int64_t id : *list) {
      NUMESH_CHECK(id < c.vocab_size, ValueError, "{}: token id {} is outside the vocabulary of {}",
                   source, id, c.vocab_size);
    }
  }
  return c;
}

namespace {

json read_json(const std::filesystem::path& file) {
  std::ifstream in(file);
  NUMESH_CHECK(in.good(), IoError, "cannot read {}", file.string());
  std::stringstream text;
  text << in.rdbuf();
  try {
    return json::parse(text.str());
  } catch (const json::exception& e) {
    // parse_error, and out_of_range for a number beyond double ("1e999").
    throw IoError(fmt::format("{} is not JSON: {}", file.string(), e.what()));
  }
}

}  // namespace

HfConfig HfConfig::load(const std::filesystem::path& path) {
  NUMESH_CHECK(
      std::filesystem::exists(path), IoError,
      "{} does not exist (expected a model folder holding config.json, or a config.json file)",
      path.string());
  const bool folder = std::filesystem::is_directory(path);
  const std::filesystem::path file = folder ? path / "config.json" : path;
  HfConfig c = parse(read_json(file), file.string());
  // generation_config.json's special ids win, as they do when transformers generates (Llama 3
  // Instruct lists its end-of-turn ids there only).
  const std::filesystem::path generation =
      (folder ? path : path.parent_path()) / "generation_config.json";
  if (std::filesystem::exists(generation)) {
    const json g = read_json(generation);
    NUMESH_CHECK(g.is_object(), ValueError,
                 "{}: a generation_config.json holds a JSON object, not {}", generation.string(),
                 g.type_name());
    const Fields f(g, generation.string());
    if (f.has("bos_token_id")) c.bos_token_ids = f.ids("bos_token_id");
    if (f.has("eos_token_id")) c.eos_token_ids = f.ids("eos_token_id");
    for (const auto* list : {&c.bos_token_ids, &c.eos_token_ids}) {
      for (std::int64_t id : *list) {
        NUMESH_CHECK(id < c.vocab_size, ValueError,
                     "{}: token id {} is outside the vocabulary of {}", generation.string(), id,
                     c.vocab_size);
      }
    }
  }
  return c;
}

float HfConfig::embedding_scale() const noexcept {
  switch (spec().embedding_scale) {
    case EmbeddingScale::kNone:
      return 1.0f;
    case EmbeddingScale::kSqrtHidden:
      return std::sqrt(static_cast<float>(hidden_size));
  }
  return 1.0f;
}

ops::TransformerConfig HfConfig::transformer_config() const {
  ops::TransformerConfig t;
  t.hidden = hidden_size;
  t.layers = num_hidden_layers;
  t.attention = ops::AttentionConfig{.num_heads = num_attention_heads,
                                     .num_kv_heads = num_key_value_heads,
                                     .head_dim = head_dim,
                                     .rope_theta = static_cast<float>(rope_theta),
                                     .rope_scaling = rope_scaling,
                                     .qk_norm_eps = static_cast<float>(rms_norm_eps)};
  t.ffn = intermediate_size > 0 ? intermediate_size : moe_intermediate_size;
  t.mlp_kind = spec().mlp_kind;
  t.norm_eps = static_cast<float>(rms_norm_eps);
  t.norm_weight_offset = spec().norm_offset;
  t.moe_every = num_experts > 0 ? decoder_sparse_step : 0;
  if (num_experts > 0) {
    t.moe = ops::MoeConfig{
        .num_experts = num_experts, .top_k = num_experts_per_tok, .renormalize = norm_topk_prob};
    t.moe_ffn = moe_intermediate_size;
    t.shared_expert_ffn = shared_expert_intermediate_size;
    // transformers asks only whether a layer is listed: a repeat means nothing more.
    t.dense_layers = mlp_only_layers;
    std::sort(t.dense_layers.begin(), t.dense_layers.end());
    t.dense_layers.erase(std::unique(t.dense_layers.begin(), t.dense_layers.end()),
                         t.dense_layers.end());
  }
  t.validate();
  return t;
}

}  // namespace numesh::models
