#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "numesh/models/formats/gguf.hpp"

// What the commands need of a tokenizer, whichever kind a model folder holds: Hugging Face's
// tokenizer.json of the byte-level BPE kind (Tokenizer: Llama 3, Qwen) or a SentencePiece model,
// tokenizer.model (Llama 2, Mistral, TinyLlama), through Debian's libsentencepiece.

namespace numesh::models {

/// A loaded tokenizer. Immutable; encode and decode may run on several threads at once.
class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;
  /// The ids of `text`; with `add_special_tokens` the template's special tokens (BOS) too.
  /// Throws: ValueError for text that is not UTF-8 (naming the offset).
  [[nodiscard]] virtual std::vector<std::int32_t> encode(std::string_view text,
                                                         bool add_special_tokens) const = 0;
  /// The text of `ids`; with `skip_special_tokens` special and control tokens are left out.
  /// Throws: IndexError naming an id the tokenizer does not have.
  [[nodiscard]] virtual std::string decode(std::span<const std::int32_t> ids,
                                           bool skip_special_tokens) const = 0;
  /// Ids are below this.
  [[nodiscard]] virtual std::int64_t vocab_size() const noexcept = 0;
  /// Whether `id` names a token.
  [[nodiscard]] virtual bool knows(std::int32_t id) const noexcept = 0;
  /// "tokenizer.json (byte-level BPE)" or "tokenizer.model (SentencePiece)".
  [[nodiscard]] virtual std::string_view kind() const noexcept = 0;

  /// The tokenizer of a model folder (or the file itself): tokenizer.json when it is of a kind
  /// numesh reads, else tokenizer.model. A SentencePiece tokenizer adds BOS (its bos id) as
  /// Llama 2's add_bos_token does.
  /// Throws: IoError naming the folder when it holds neither file; what Tokenizer::load throws
  /// when tokenizer.json is refused and there is no tokenizer.model; IoError naming
  /// tokenizer.model when SentencePiece cannot load it.
  [[nodiscard]] static std::unique_ptr<TextTokenizer> load(const std::filesystem::path& path);

  /// The tokenizer a GGUF file's metadata describes, or null when it has none
  /// (tokenizer.ggml.model absent): "gpt2", byte-level BPE from tokens, token types, merges and
  /// the pre-tokenizer's name, giving the ids the model's tokenizer.json gives; "llama",
  /// SentencePiece from tokens, scores and types, giving the ids its tokenizer.model gives
  /// (BOS added unless tokenizer.ggml.add_bos_token is false; for gpt2 when it is true, or,
  /// without the key, for Llama 3's pre-tokenizer, as llama.cpp does).
  /// Throws: ValueError naming the file for another tokenizer.ggml.model, and for metadata it
  /// cannot read (naming the key); what Tokenizer::parse throws.
  [[nodiscard]] static std::unique_ptr<TextTokenizer> from_gguf(const GgufFile& file);
};

}  // namespace numesh::models
