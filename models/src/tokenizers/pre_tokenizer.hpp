#pragma once

// PRIVATE to models/src: tokenizer.json's pre_tokenizer for byte-level BPE: a Sequence of
// Split steps (a regex or a literal string, behavior Isolated, or Removed with or without
// invert) ending in a ByteLevel step, or a ByteLevel step alone. Regexes run on Oniguruma, the
// engine Hugging Face tokenizers compiles them with, so Unicode classes (\p{L}, \s),
// case-insensitive groups and lookahead mean there exactly what they mean there.

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace numesh::models::detail {

/// A compiled Oniguruma regex (UTF-8, Oniguruma's default syntax and options, as the onig crate
/// behind Hugging Face tokenizers uses them).
class OnigRegex {
 public:
  /// Throws: ValueError "<source>: <what> regex '<pattern>' does not compile: <onig's message>".
  OnigRegex(std::string_view pattern, std::string_view source, std::string_view what);
  OnigRegex(OnigRegex&&) noexcept;
  OnigRegex& operator=(OnigRegex&&) noexcept;
  ~OnigRegex();

  /// Appends to `out` the pieces of `text` (valid UTF-8) that the regex's successive matches
  /// and the gaps between them make, in order, leaving out empty ones (Split's "Isolated"), or
  /// only the matches (keep_gaps false: "Removed" with invert), or only the gaps (keep_matches
  /// false: "Removed").
  void split(std::string_view text, std::vector<std::string_view>& out, bool keep_matches = true,
             bool keep_gaps = true) const;

 private:
  struct Compiled;
  std::unique_ptr<Compiled> compiled_;
};

/// GPT-2's split regex, which a ByteLevel pre-tokenizer with use_regex applies.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

/// The pre-tokenizer of a tokenizer.json.
class PreTokenizer {
 public:
  /// Reads `json` (the pre_tokenizer field).
  /// Throws: ValueError naming `source`, the field and its value for anything but Split{Regex
  /// or String, Isolated or Removed} steps followed by one ByteLevel step.
  static PreTokenizer from_json(const nlohmann::json& json, std::string_view source);

  /// Appends the words of `text` (valid UTF-8), each in GPT-2's byte-level form, to `out`.
  void split(std::string_view text, std::vector<std::string>& out) const;

 private:
  struct Step {
    std::unique_ptr<OnigRegex> regex;  // a Split step with a Regex pattern
    std::string literal;               // a Split step with a String pattern
    bool keep_matches = true;          // false: Removed, invert false (drop the delimiters)
    bool keep_gaps = true;             // false: Removed, invert true (keep only the matches)
  };
  std::vector<Step> splits_;
  bool add_prefix_space_ = false;
  std::unique_ptr<OnigRegex> byte_level_regex_;  // ByteLevel with use_regex: GPT-2's pattern
};

}  // namespace numesh::models::detail
