#include "numesh/models/engine/model_source.hpp"

#include "numesh/models/formats/safetensors_checkpoint.hpp"

namespace numesh::models {

ModelSource ModelSource::open(const std::filesystem::path& path) {
  ModelSource source;
  source.path_ = path;
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
  return std::make_unique<SafetensorsCheckpoint>(SafetensorsCheckpoint::open(path_));
}

std::vector<std::filesystem::path> ModelSource::weight_files() const {
  return open_checkpoint()->weight_files();
}

}  // namespace numesh::models
