#include "numesh/models/engine/model_source.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "numesh/models/formats/safetensors_checkpoint.hpp"
#include "numesh/models/hf/gguf_checkpoint.hpp"

namespace numesh::models {

namespace {

// The special tokens a chat template reads (bos_token, eos_token, ...) from a GGUF file's
// tokenizer.ggml.*_token_id, as tokenizer_config.json names them.
nlohmann::ordered_json gguf_special_tokens(const GgufFile& meta) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  const auto tokens = meta.get_strings("tokenizer.ggml.tokens");
  if (!tokens) return out;
  for (const std::string_view name : {"bos", "eos", "unknown", "padding"}) {
    const auto id = meta.get_int(fmt::format("tokenizer.ggml.{}_token_id", name));
    if (!id || *id < 0 || *id >= static_cast<std::int64_t>(tokens->size())) continue;
    const std::string_view field = name == "unknown" ? "unk" : name == "padding" ? "pad" : name;
    out[fmt::format("{}_token", field)] = (*tokens)[static_cast<std::size_t>(*id)];
  }
  return out;
}

}  // namespace

ModelSource ModelSource::open(const std::filesystem::path& path) {
  ModelSource source;
  source.path_ = path;
  if (GgufCheckpoint::is_gguf(path)) {
    const GgufCheckpoint checkpoint = GgufCheckpoint::open(path);
    source.config_ = checkpoint.config();
    source.gguf_ = true;
    source.stored_dtype_ = checkpoint.stored_dtype();
    const GgufFile& meta = checkpoint.files().front();
    source.tokenizer_ = TextTokenizer::from_gguf(meta);
    if (const auto text = meta.get_string("tokenizer.chat_template")) {
      try {
        source.chat_template_ = ChatTemplate::parse(
            *text, fmt::format("{} (tokenizer.chat_template)", meta.path().string()),
            gguf_special_tokens(meta));
      } catch (const Error& e) {
        source.chat_template_error_ = e.what();
      }
    }
    return source;
  }
  source.config_ = HfConfig::load(path);
  if (std::filesystem::exists(path / "tokenizer.json") ||
      std::filesystem::exists(path / "tokenizer.model")) {
    source.tokenizer_ = TextTokenizer::load(path);
  }
  try {
    source.chat_template_ = ChatTemplate::load(path);
  } catch (const Error& e) {
    // A template numesh cannot use (its syntax, a tokenizer_config.json it cannot read) costs
    // the model its chat, not its completions.
    source.chat_template_error_ = e.what();
  }
  return source;
}

std::unique_ptr<Checkpoint> ModelSource::open_checkpoint() const {
  if (gguf_) return std::make_unique<GgufCheckpoint>(GgufCheckpoint::open(path_));
  return std::make_unique<SafetensorsCheckpoint>(SafetensorsCheckpoint::open(path_));
}

std::vector<std::filesystem::path> ModelSource::weight_files() const {
  return open_checkpoint()->weight_files();
}

}  // namespace numesh::models
