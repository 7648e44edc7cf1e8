#include "numesh/models/engine/gguf_export.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../tokenizers/gguf_tokenizer.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/models/formats/gguf_writer.hpp"
#include "numesh/models/hf/gguf_checkpoint.hpp"
#include "numesh/ops/kernels/rope.hpp"

namespace numesh::models {

namespace {

// The metadata llama.cpp's converter writes for the model's hyperparameters.
void add_hyperparameters(GgufWriter& w, const HfConfig& c, const std::string& name, DType format) {
  const ArchitectureSpec& spec = c.spec();
  const std::string arch(spec.gguf_name);
  const auto key = [&](std::string_view k) { return fmt::format("{}.{}", arch, k); };
  const auto u32 = [](std::int64_t v) { return static_cast<std::uint32_t>(v); };
  w.add_string("general.architecture", arch);
  w.add_string("general.type", "model");
  w.add_string("general.name", name);
  w.add_uint32(key("block_count"), u32(c.num_hidden_layers));
  // numesh runs a sliding-window model over its window at most; where GGUF has no window key
  // for the architecture, the context length says so.
  w.add_uint32(key("context_length"),
               u32(spec.gguf_sliding_window ? c.max_position_embeddings : c.max_context()));
  if (spec.gguf_sliding_window && c.sliding_window)
    w.add_uint32(key("attention.sliding_window"), u32(*c.sliding_window));
  w.add_uint32(key("embedding_length"), u32(c.hidden_size));
  // Mixtral's experts' size is its config.json intermediate_size (and GGUF's).
  const bool experts_ffn = spec.moe && spec.moe->expert_ffn_field == "intermediate_size";
  const std::int64_t ffn = experts_ffn ? c.moe_intermediate_size : c.intermediate_size;
  if (ffn > 0) w.add_uint32(key("feed_forward_length"), u32(ffn));
  w.add_uint32(key("attention.head_count"), u32(c.num_attention_heads));
  w.add_uint32(key("attention.head_count_kv"), u32(c.num_key_value_heads));
  if (spec.gguf_rope_base || c.rope_theta != spec.default_rope_theta)
    w.add_float32(key("rope.freq_base"), static_cast<float>(c.rope_theta));
  w.add_float32(key("attention.layer_norm_rms_epsilon"), static_cast<float>(c.rms_norm_eps));
  if (c.rope_scaling.kind == ops::RopeScaling::Kind::kLinear) {
    w.add_string(key("rope.scaling.type"), "linear");
    w.add_float32(key("rope.scaling.factor"), static_cast<float>(c.rope_scaling.factor));
  }
  if (c.num_experts > 0) {
    w.add_uint32(key("expert_count"), u32(c.num_experts));
    w.add_uint32(key("expert_used_count"), u32(c.num_experts_per_tok));
  }
  w.add_uint32(key("attention.key_length"), u32(c.head_dim));
  w.add_uint32(key("attention.value_length"), u32(c.head_dim));
  w.add_uint32("general.file_type", traits(format).llama_file_type);
  if (spec.gguf_vocab_size) w.add_uint32(key("vocab_size"), u32(c.vocab_size));
  if (spec.gguf_rope_dimension_count) w.add_uint32(key("rope.dimension_count"), u32(c.head_dim));
  if (spec.moe && spec.moe->expert_ffn_field != "intermediate_size")
    w.add_uint32(key("expert_feed_forward_length"), u32(c.moe_intermediate_size));
  if (c.shared_expert_intermediate_size > 0) {
    w.add_uint32(key("expert_shared_feed_forward_length"), u32(c.shared_expert_intermediate_size));
  }
  w.add_uint32("general.quantization_version", 2);
}

// The config's special ids where the tokenizer did not name them: bos, and the ids generation
// stops at: the first as eos, the others by their text (`tokens`, one an id) as llama.cpp's
// converter names them: <|eom_id|> as eom, any other (Llama 3's <|eot_id|>) as eot. Readers
// stop at all three (and llama.cpp and numesh at the control tokens they know by text).
void add_special_ids(GgufWriter& w, const HfConfig& c, const std::vector<std::string>& tokens) {
  const auto add = [&](const char* key, std::int64_t id) {
    if (!w.contains(key)) w.add_uint32(key, static_cast<std::uint32_t>(id));
  };
  if (!c.bos_token_ids.empty()) add("tokenizer.ggml.bos_token_id", c.bos_token_ids.front());
  for (std::size_t i = 0; i < c.eos_token_ids.size(); ++i) {
    const std::int64_t id = c.eos_token_ids[i];
    const bool named = id >= 0 && id < static_cast<std::int64_t>(tokens.size());
    // Both arms views: `named ? tokens[i] : ""` would be a std::string temporary, dangling.
    const std::string_view text =
        named ? std::string_view(tokens[static_cast<std::size_t>(id)]) : std::string_view();
    add(i == 0                 ? "tokenizer.ggml.eos_token_id"
        : text == "<|eom_id|>" ? "tokenizer.ggml.eom_token_id"
                               : "tokenizer.ggml.eot_token_id",
        id);
  }
}

// A GGUF source's tokenizer.* metadata, copied as it is; returns its token list.
std::vector<std::string> copy_gguf_tokenizer(GgufWriter& w, const GgufFile& meta) {
  for (const std::string& key : meta.keys()) {
    if (key.starts_with("tokenizer.")) w.add_value(key, *meta.find(key));
  }
  return meta.get_strings("tokenizer.ggml.tokens").value_or(std::vector<std::string>{});
}

// Reorders the rows of a q or k projection (or bias) from Hugging Face's rotate-half layout to
// GGML's interleaved pairs, as llama.cpp's converter does: GGUF row h*d + 2j + s is Hugging Face
// row h*d + s*d/2 + j.
void permute_rows(std::span<std::byte> data, std::int64_t rows, std::int64_t heads,
                  std::size_t row_bytes) {
  const std::vector<std::byte> hf(data.begin(), data.end());
  const std::int64_t d = rows / heads;
  for (std::int64_t h = 0; h < heads; ++h) {
    for (std::int64_t j = 0; j < d / 2; ++j) {
      for (std::int64_t s = 0; s < 2; ++s) {
        const auto to = static_cast<std::size_t>(h * d + 2 * j + s) * row_bytes;
        const auto from = static_cast<std::size_t>(h * d + s * d / 2 + j) * row_bytes;
        std::memcpy(data.data() + to, hf.data() + from, row_bytes);
      }
    }
  }
}

}  // namespace

GgufExportReport write_gguf(const ModelSource& source, const std::filesystem::path& file,
                            DType format, const ExportProgress& progress) {
  const HfConfig& config = source.config();
  const ArchitectureSpec& spec = config.spec();
  (void)config.transformer_config();  // refuses what numesh does not run
  const std::unique_ptr<Checkpoint> checkpoint = source.open_checkpoint();
  const std::optional<GgufType> asked = to_gguf_type(format);
  NUMESH_CHECK(asked.has_value(), ValueError, "gguf: no GGUF type holds {}", to_string(format));

  GgufWriter w;
  NUMESH_CHECK(config.tie_word_embeddings || spec.gguf_has_output, NotImplementedError,
               "gguf: this {} model has an LM head of its own (tie_word_embeddings false), and "
               "llama.cpp's '{}' architecture reads none: its head is the embedding",
               to_string(config.architecture), spec.gguf_name);
  GgufExportReport report;
  std::string name = source.path().filename().string();
  if (name.empty() || name == ".") name = source.path().parent_path().filename().string();
  add_hyperparameters(w, config, name, format);
  const auto* gguf = dynamic_cast<const GgufCheckpoint*>(checkpoint.get());
  detail::GgufTokenizerWritten written =
      gguf != nullptr
          ? detail::GgufTokenizerWritten{copy_gguf_tokenizer(w, gguf->files().front()), ""}
          : detail::add_gguf_tokenizer(w, source.path(), config.vocab_size);
  const std::vector<std::string>& tokens = written.tokens;
  report.tokenizer = !tokens.empty();
  report.tokenizer_lost = std::move(written.lost);
  add_special_ids(w, config, tokens);
  if (const ChatTemplate* t = source.chat_template();
      t != nullptr && !w.contains("tokenizer.chat_template")) {
    w.add_string("tokenizer.chat_template", t->source());
    report.chat_template = true;
  }

  // Llama 3.1's RoPE scaling as llama.cpp's converter stores it: rope_freqs, first, one divisor
  // a frequency pair (the unscaled frequency over the scaled one).
  if (config.rope_scaling.kind == ops::RopeScaling::Kind::kLlama3 ||
      config.rope_scaling.kind == ops::RopeScaling::Kind::kFactors) {
    const std::vector<double> base =
        ops::rope_frequencies(config.head_dim, config.rope_theta, ops::RopeScaling{});
    const std::vector<double> scaled =
        ops::rope_frequencies(config.head_dim, config.rope_theta, config.rope_scaling);
    std::vector<float> factors(base.size());
    for (std::size_t i = 0; i < base.size(); ++i)
      factors[i] = static_cast<float>(base[i] / scaled[i]);
    w.add_tensor("rope_freqs.weight", {static_cast<std::int64_t>(factors.size())}, GgufType::kF32,
                 [factors](std::span<std::byte> bytes) {
                   std::memcpy(bytes.data(), factors.data(), bytes.size());
                 });
    ++report.tensors;
    ++report.formats["f32"];
  }
  // The weights: token_embd, each layer's, then output_norm and output.
  std::uint64_t total = 0;
  std::shared_ptr<std::uint64_t> done = std::make_shared<std::uint64_t>(0);
  const auto add = [&](const TensorPattern& p, std::int64_t layer) {
    const bool per_expert = p.hf.find("{E}") != std::string_view::npos;
    std::vector<std::string> parts;
    if (per_expert) {
      for (std::int64_t e = 0; e < config.num_experts; ++e)
        parts.push_back(spec.hf_name(p.slot, layer, e));
    } else {
      parts.push_back(spec.hf_name(p.slot, layer));
    }
    if (!checkpoint->contains(parts.front())) return;  // an optional weight the model has not
    // A fused tensor (Phi-3's qkv_proj, gate_up_proj) goes in whole, once: at its first slice.
    if (p.fused != FusedPart::kWhole && p.fused != FusedPart::kQ && p.fused != FusedPart::kGate)
      return;
    const std::vector<std::int64_t> part_shape = checkpoint->shape(parts.front());
    std::vector<std::int64_t> shape = part_shape;
    if (per_expert) shape.insert(shape.begin(), config.num_experts);
    const std::string_view slot = p.slot;
    const bool f32 = part_shape.size() == 1 || slot.ends_with(".moe.router") ||
                     slot.ends_with(".moe.shared_expert_gate");
    GgufType type = f32 ? GgufType::kF32 : *asked;
    if (!f32 && part_shape.back() % block_elements(type) != 0) {
      type = GgufType::kF16;  // llama.cpp's converter falls back the same way
      ++report.fallbacks;
    }
    std::int64_t heads = 0;
    if (spec.gguf_permutes_qk) {
      if (slot.ends_with("attention.wq") || slot.ends_with("attention.bq"))
        heads = config.num_attention_heads;
      if (slot.ends_with("attention.wk") || slot.ends_with("attention.bk"))
        heads = config.num_key_value_heads;
    }
    // llama.cpp's converter writes Gemma's block and final norms as 1 + w, as its reader wants.
    const float add_to_values = takes_norm_offset(slot) ? spec.norm_offset : 0.0f;
    const DType dtype = *to_numesh_dtype(type);
    std::uint64_t stored = 0;
    for (const std::string& part : parts) stored += checkpoint->stored_bytes(part);
    total += stored;
    ++report.tensors;
    ++report.formats[std::string(to_string(dtype))];
    w.add_tensor(
        spec.gguf_name_of(p.slot, layer), shape, type,
        [&checkpoint = *checkpoint, parts, part_shape, dtype, heads, stored, done, &progress,
         &total, add_to_values](std::span<std::byte> bytes) {
          const std::size_t each = bytes.size() / parts.size();
          for (std::size_t e = 0; e < parts.size(); ++e)
            checkpoint.read(parts[e], dtype, bytes.subspan(e * each, each));
          if (add_to_values != 0.0f) {  // an f32 norm
            for (float& v :
                 std::span(reinterpret_cast<float*>(bytes.data()), bytes.size() / sizeof(float)))
              v += add_to_values;
          }
          if (heads > 0) {
            const std::int64_t rows = part_shape.front();
            permute_rows(bytes, rows, heads, bytes.size() / static_cast<std::size_t>(rows));
          }
          *done += stored;
          if (progress) progress(*done, total);
        });
  };
  const auto layer_patterns = [&](bool per_layer) {
    std::vector<const TensorPattern*> out;
    for (const TensorPattern& p : spec.tensors) {
      if ((p.slot.find("{L}") != std::string_view::npos) == per_layer) out.push_back(&p);
    }
    return out;
  };
  const std::vector<const TensorPattern*> global = layer_patterns(false);
  const auto add_global = [&](std::string_view slot) {
    for (const TensorPattern* p : global) {
      if (p->slot == slot) add(*p, -1);
    }
  };
  add_global("embedding.table");
  for (std::int64_t l = 0; l < config.num_hidden_layers; ++l) {
    if (config.num_experts > 0 && spec.moe && spec.moe->sparse_layer_fields) {
      NUMESH_CHECK(config.is_moe_layer(l), NotImplementedError,
                   "gguf: layer {} of this {} model is dense (mlp_only_layers / "
                   "decoder_sparse_step); llama.cpp has no names for a dense layer in a MoE "
                   "architecture",
                   l, to_string(config.architecture));
    }
    for (const TensorPattern* p : layer_patterns(true)) add(*p, l);
  }
  add_global("final_norm");
  if (!config.tie_word_embeddings) add_global("lm_head.weight");
  w.write(file);
  report.bytes = std::filesystem::file_size(file);
  return report;
}

}  // namespace numesh::models
