#include "numesh/models/tokenizers/text_tokenizer.hpp"

#include <fmt/format.h>
#include <sentencepiece_processor.h>

#include "gguf_tokenizer.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/models/tokenizers/tokenizer.hpp"

namespace numesh::models {

namespace {

// tokenizer.json's byte-level BPE.
class HfTokenizer final : public TextTokenizer {
 public:
  HfTokenizer(Tokenizer t, std::string_view kind) : t_(std::move(t)), kind_(kind) {}
  std::vector<std::int32_t> encode(std::string_view text, bool special) const override {
    return t_.encode(text, special);
  }
  std::string decode(std::span<const std::int32_t> ids, bool skip) const override {
    return t_.decode(ids, skip);
  }
  std::int64_t vocab_size() const noexcept override { return t_.vocab_size(); }
  bool knows(std::int32_t id) const noexcept override {
    try {
      return t_.id_to_token(id).has_value();
    } catch (...) {
      return false;
    }
  }
  std::string_view kind() const noexcept override { return kind_; }

 private:
  Tokenizer t_;
  std::string_view kind_;
};

constexpr std::string_view kTokenizerJson = "tokenizer.json (byte-level BPE)";

// A SentencePiece model (tokenizer.model), through libsentencepiece.
class SentencePieceTokenizer final : public TextTokenizer {
 public:
  explicit SentencePieceTokenizer(const std::filesystem::path& file)
      : kind_("tokenizer.model (SentencePiece)") {
    const auto status = sp_.Load(file.string());
    NUMESH_CHECK(status.ok(), IoError, "{}: SentencePiece cannot load it: {}", file.string(),
                 status.ToString());
  }
  // A model given as a serialized ModelProto (a GGUF file's, `source` naming it), adding BOS
  // on encode when `add_bos`.
  SentencePieceTokenizer(std::string_view proto, const std::filesystem::path& source, bool add_bos)
      : kind_("GGUF tokenizer.ggml (SentencePiece)"), add_bos_(add_bos) {
    const auto status = sp_.LoadFromSerializedProto(proto);
    NUMESH_CHECK(status.ok(), ValueError, "{}: SentencePiece cannot load its tokenizer: {}",
                 source.string(), status.ToString());
  }
  std::vector<std::int32_t> encode(std::string_view text, bool special) const override {
    std::vector<int> ids;
    const auto status = sp_.Encode(text, &ids);
    NUMESH_CHECK(status.ok(), ValueError, "tokenizer: SentencePiece cannot encode the text: {}",
                 status.ToString());
    std::vector<std::int32_t> out;
    if (special && add_bos_ && sp_.bos_id() >= 0) out.push_back(sp_.bos_id());
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
  }
  std::string decode(std::span<const std::int32_t> ids, bool skip) const override {
    std::vector<int> kept;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      NUMESH_CHECK(ids[i] >= 0 && ids[i] < sp_.GetPieceSize(), IndexError,
                   "tokenizer: token id {} at position {} is outside the vocabulary (size {})",
                   ids[i], i, sp_.GetPieceSize());
      if (skip && (sp_.IsControl(ids[i]) || sp_.IsUnknown(ids[i]))) continue;
      kept.push_back(ids[i]);
    }
    std::string text;
    const auto status = sp_.Decode(kept, &text);
    NUMESH_CHECK(status.ok(), ValueError, "tokenizer: SentencePiece cannot decode the ids: {}",
                 status.ToString());
    return text;
  }
  std::int64_t vocab_size() const noexcept override { return sp_.GetPieceSize(); }
  bool knows(std::int32_t id) const noexcept override { return id >= 0 && id < sp_.GetPieceSize(); }
  std::string_view kind() const noexcept override { return kind_; }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  std::string_view kind_;
  bool add_bos_ = true;  // Llama 2's add_bos_token
};

}  // namespace

std::unique_ptr<TextTokenizer> TextTokenizer::load(const std::filesystem::path& path) {
  if (std::filesystem::is_regular_file(path)) {
    if (path.extension() == ".model") return std::make_unique<SentencePieceTokenizer>(path);
    return std::make_unique<HfTokenizer>(Tokenizer::load(path), kTokenizerJson);
  }
  const std::filesystem::path json = path / "tokenizer.json", model = path / "tokenizer.model";
  const bool has_model = std::filesystem::exists(model);
  if (std::filesystem::exists(json)) {
    try {
      return std::make_unique<HfTokenizer>(Tokenizer::load(json), kTokenizerJson);
    } catch (const Error&) {
      // Llama 2 and Mistral ship a tokenizer.json of the SentencePiece-BPE kind, which
      // Tokenizer refuses, beside the tokenizer.model that describes the same tokenizer.
      if (!has_model) throw;
    }
  }
  NUMESH_CHECK(has_model, IoError, "{} holds no tokenizer.json or tokenizer.model", path.string());
  return std::make_unique<SentencePieceTokenizer>(model);
}

std::unique_ptr<TextTokenizer> TextTokenizer::from_gguf(const GgufFile& file) {
  const std::optional<std::string> model = file.get_string("tokenizer.ggml.model");
  if (!model) return nullptr;
  if (*model == "gpt2") {
    return std::make_unique<HfTokenizer>(
        Tokenizer::parse(detail::gguf_tokenizer_json(file),
                         fmt::format("{} (its GGUF tokenizer)", file.path().string())),
        "GGUF tokenizer.ggml (byte-level BPE)");
  }
  if (*model == "llama") {
    return std::make_unique<SentencePieceTokenizer>(
        detail::gguf_sentencepiece_model(file), file.path(),
        file.get_bool("tokenizer.ggml.add_bos_token").value_or(true));
  }
  throw ValueError(fmt::format(
      "{}: tokenizer.ggml.model '{}' is not a tokenizer numesh reads (gpt2: byte-level BPE, "
      "llama: SentencePiece)",
      file.path().string(), *model));
}

}  // namespace numesh::models
