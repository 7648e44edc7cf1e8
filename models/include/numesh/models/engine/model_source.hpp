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
// Today a Hugging Face folder: config.json, safetensors (one file or shards), and
// tokenizer.json or tokenizer.model when it has one, and the chat template of
// chat_template.jinja or tokenizer_config.json.

namespace numesh::models {

/// An opened model folder. Move-only (it owns the tokenizer); immutable after open().
class ModelSource {
 public:
  /// Opens `path`: reads its config (and generation_config.json), its tokenizer when the
  /// folder holds tokenizer.json or tokenizer.model, and its chat template when it has one (a
  /// template that cannot be loaded or parsed is kept as chat_template_error(), not thrown: the
  /// model still serves completions).
  /// Throws: what HfConfig::load throws (IoError naming a folder without config.json,
  /// ValueError for a config numesh cannot read); what TextTokenizer::load throws for a
  /// tokenizer it cannot load.
  [[nodiscard]] static ModelSource open(const std::filesystem::path& path);

  /// The folder given to open().
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  /// Its config.
  [[nodiscard]] const HfConfig& config() const noexcept { return config_; }
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
  /// Throws: what SafetensorsCheckpoint::open throws.
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
};

}  // namespace numesh::models
