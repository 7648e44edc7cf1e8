#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

// A Hugging Face tokenizer.json of the byte-level BPE kind (GPT-2's scheme, as Llama 3, Qwen2,
// Qwen2.5 and Qwen3 use it), giving exactly the ids and text Hugging Face's `tokenizers` gives:
//   encode: added tokens are cut out of the raw text first (leftmost, longest match); the rest
//   is normalised (NFC or nothing), split by the pre-tokenizer's regexes (Oniguruma, the engine
//   `tokenizers` itself uses), mapped byte by byte through GPT-2's byte-to-unicode table and
//   merged by BPE in merge-rank order; the post-processor adds BOS-like tokens.
//   decode: tokens back to their strings, GPT-2's table backwards, and the bytes read as UTF-8
//   with U+FFFD for what is not (as Rust's String::from_utf8_lossy).
// Everything else a tokenizer.json can say is refused at load, naming the field and its value,
// so a tokenizer numesh cannot reproduce exactly never encodes anything.

namespace numesh::models {

/// One entry of tokenizer.json's `added_tokens`: a string that is matched in the text as a
/// whole before any splitting (special tokens such as `<|begin_of_text|>` are added tokens).
struct AddedToken {
  std::int32_t id = 0;
  std::string content;
  /// Left out of decode(ids, skip_special_tokens = true).
  bool special = false;
  /// Whitespace before the match is taken into the token.
  bool lstrip = false;
  /// Whitespace after the match is taken into the token.
  bool rstrip = false;
  /// Matched in the normalised text instead of the raw text.
  bool normalized = false;
};

/// A loaded tokenizer. Immutable after load; encode() and decode() may be called from any
/// number of threads at once (the BPE word cache is guarded by a mutex).
class Tokenizer {
 public:
  /// Reads `path`: a tokenizer.json file, or a directory holding one.
  /// Throws: ValueError naming the file when it is missing or unreadable, is not strict JSON
  /// (parse_strict_json's rules), or has a field numesh does not read exactly (the field and
  /// its value, e.g. "<file>: model type 'WordPiece' is not supported (BPE)").
  [[nodiscard]] static Tokenizer load(const std::filesystem::path& path);

  /// Parses the text of a tokenizer.json; `source` names it in messages.
  /// Throws: ValueError as load().
  [[nodiscard]] static Tokenizer parse(std::string_view json_text, std::string_view source);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  /// The ids of `text` (UTF-8). With add_special_tokens, the post-processor's template is
  /// applied (Llama 3's `<|begin_of_text|>` in front).
  /// Throws: ValueError "tokenizer: the text is not valid UTF-8 (byte 0x.. at offset N)" (or
  /// "... it ends inside a character").
  [[nodiscard]] std::vector<std::int32_t> encode(std::string_view text,
                                                 bool add_special_tokens = true) const;

  /// The text of `ids`; with skip_special_tokens, added tokens marked special are left out.
  /// Bytes that do not form UTF-8 (an id sequence cut inside a character) become U+FFFD.
  /// Throws: IndexError "tokenizer: token id X at position P is outside the vocabulary (size
  /// N)" for an id < 0 or >= vocab_size(), or "... has no token" for an id inside it that no
  /// token has.
  [[nodiscard]] std::string decode(std::span<const std::int32_t> ids,
                                   bool skip_special_tokens = false) const;

  /// One more than the largest id of the model's vocabulary and the added tokens.
  [[nodiscard]] std::int64_t vocab_size() const noexcept;

  /// The id of a token string (the model's byte-level form, e.g. "Ġworld", or an added token's
  /// content), or nullopt.
  [[nodiscard]] std::optional<std::int32_t> token_to_id(std::string_view token) const;

  /// The token string of `id`, or nullopt when no token has it.
  [[nodiscard]] std::optional<std::string> id_to_token(std::int32_t id) const;

  /// The added tokens, in the file's order.
  [[nodiscard]] const std::vector<AddedToken>& added_tokens() const noexcept;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  // parse() without its net for nlohmann's exceptions.
  static Tokenizer parse_checked(std::string_view json_text, std::string_view source);
  std::unique_ptr<Impl> impl_;
};

}  // namespace numesh::models
