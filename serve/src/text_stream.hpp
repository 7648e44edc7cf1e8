#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "numesh/models/tokenizers/text_tokenizer.hpp"

// A request's text as its tokens come: decoded, handed out in whole UTF-8 characters (a token
// can end inside one), and cut at the first stop string, of which nothing is handed out.

namespace numesh::serve {

/// One request's text. Not thread-safe: the request's handler owns it.
class TextStream {
 public:
  /// Text by `tokenizer` (null: no text, ids only); `stop` strings end the text.
  TextStream(const models::TextTokenizer* tokenizer, std::vector<std::string> stop);
  /// Adds a generated token; returns the text that can be handed out now (maybe none). Ids the
  /// tokenizer does not know (a model's padded vocabulary) add no text.
  std::string add(std::int32_t token);
  /// The request ended: the text held back so far (a partial stop string, an unfinished
  /// character), unless a stop string was found.
  std::string finish();
  /// Whether a stop string appeared (the request should end; its text stops before it).
  [[nodiscard]] bool stopped() const noexcept { return stopped_; }
  /// Every token added, the one that completed a stop string included.
  [[nodiscard]] const std::vector<std::int32_t>& tokens() const noexcept { return tokens_; }
  /// The text handed out so far.
  [[nodiscard]] const std::string& text() const noexcept { return emitted_; }

 private:
  const models::TextTokenizer* tokenizer_;
  std::vector<std::string> stop_;
  std::vector<std::int32_t> tokens_, known_;
  std::string emitted_;
  bool stopped_ = false;
};

/// The length of `text`'s longest prefix that does not end inside a UTF-8 character (a lead
/// byte whose continuation bytes have not all come) nor in U+FFFD (a decoder's stand-in for
/// bytes still to come).
std::size_t complete_utf8_length(const std::string& text) noexcept;

}  // namespace numesh::serve
