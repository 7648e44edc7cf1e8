#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "numesh/models/chat/chat_template.hpp"
#include "numesh/models/formats/checkpoint.hpp"
#include "numesh/models/hf/hf_config.hpp"
#include "numesh/models/tokenizers/text_tokenizer.hpp"

// A model on disk, opened before any weight is read: its config and its tokenizer, so that a
// front end checks prompts and chooses sizes before the load (Engine::load reads the weights).
// A Hugging Face folder: config.json, safetensors (one file or shards), and tokenizer.json or
// tokenizer.model when it has one, and the chat template of chat_template.jinja or
// tokenizer_config.json. Or a GGUF model (GgufCheckpoint): its metadata gives the config.

namespace numesh::models {

/// An opened model folder. Move-only (it owns the tokenizer); immutable after open().
class ModelSource {
 public:
  /// Opens `path`: a GGUF model when GgufCheckpoint::is_gguf(path) (its config from its
  /// metadata, its tokenizer from tokenizer.ggml.*, its chat template from
  /// tokenizer.chat_template), otherwise a Hugging Face
  /// folder: reads its config (and generation_config.json), its tokenizer when the
  /// folder holds tokenizer.json or tokenizer.model, and its chat template when it has one (a
  /// template that cannot be loaded or parsed is kept as chat_template_error(), not thrown: the
  /// model still serves completions).
  /// Throws: what HfConfig::load throws (IoError naming a folder without config.json,
  /// ValueError for a config numesh cannot read); what TextTokenizer::load throws for a
  /// tokenizer it cannot load; what GgufCheckpoint::open throws for a GGUF model.
  [[nodiscard]] static ModelSource open(const std::filesystem::path& path);

  /// The folder given to open().
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  /// Its config.
  [[nodiscard]] const HfConfig& config() const noexcept { return config_; }
  /// The format its weights are stored in when it is one numesh keeps weights in (a GGUF
  /// model's GgufCheckpoint::stored_dtype(): the format to load as when none is asked for);
  /// nullopt for a Hugging Face folder, whose floats load as f32 unless asked otherwise.
  [[nodiscard]] std::optional<DType> stored_dtype() const noexcept { return stored_dtype_; }
  /// Its tokenizer; null when the folder has none (ids only).
  [[nodiscard]] const TextTokenizer* tokenizer() const noexcept { return tokenizer_.get(); }
  /// Its chat template; null when the folder has none or it did not parse.
  [[nodiscard]] const ChatTemplate* chat_template() const noexcept {
    return chat_template_ ? &*chat_template_ : nullptr;
  }
  /// Why the folder's chat template cannot be used (its parse error, naming the line); empty
  /// when it parsed or there is none.
  [[nodiscard]] const std::string& chat_template_error() const noexcept {
    return chat_template_error_;
  }
  /// Its weights, opened (each file mapped and its header validated; no weight read yet).
  /// Throws: what SafetensorsCheckpoint::open or GgufCheckpoint::open throws.
  [[nodiscard]] std::unique_ptr<Checkpoint> open_checkpoint() const;
  /// The files holding its weights, in the checkpoint's order (a plain read of them is the
  /// load's baseline).
  /// Throws: as open_checkpoint().
  [[nodiscard]] std::vector<std::filesystem::path> weight_files() const;

 private:
  std::filesystem::path path_;
  HfConfig config_;
  std::unique_ptr<TextTokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  std::string chat_template_error_;
  bool gguf_ = false;
  std::optional<DType> stored_dtype_;
};

}  // namespace numesh::models
