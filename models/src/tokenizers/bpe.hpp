#pragma once

// PRIVATE to models/src: tokenizer.json's `model` of type BPE, as Hugging Face tokenizers'
// models::bpe runs it for byte-level tokenizers: a word (already in byte-level form) starts as
// its characters, and the adjacent pair of lowest merge rank is merged until no pair has a
// merge. A priority queue over adjacent pairs makes a word of n characters O(n log n), and
// words seen before come from a cache.

#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace numesh::models::detail {

/// Hashes std::string and std::string_view alike, so maps keyed by std::string are searched
/// with a string_view without building a string.
struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};
using StringIdMap = std::unordered_map<std::string, std::int32_t, StringHash, std::equal_to<>>;

class Bpe {
 public:
  /// Reads `model` (tokenizer.json's model field).
  /// Throws: ValueError naming `source`, the field and its value: a type other than BPE,
  /// byte_fallback true, dropout, a continuing_subword_prefix or end_of_word_suffix, a vocab
  /// that is not an object of distinct non-negative ids, a merge that is not "a b" or [a, b]
  /// or names a token (or a merged token) missing from the vocab, an unk_token not in it.
  static Bpe from_json(const nlohmann::json& model, std::string_view source);

  Bpe(Bpe&& other) noexcept;

  /// Appends the ids of `word` (byte-level form) to `out`.
  void tokenize(std::string_view word, std::vector<std::int32_t>& out) const;

  /// The token-to-id map of the vocabulary.
  const StringIdMap& vocab() const noexcept { return vocab_; }
  /// One more than the largest id of the vocabulary.
  std::int64_t size() const noexcept { return static_cast<std::int64_t>(tokens_.size()); }
  /// The token of `id` (REQUIRES 0 <= id < size()), or nullptr when no token has it.
  const std::string* token(std::int32_t id) const noexcept {
    const auto& t = tokens_[static_cast<std::size_t>(id)];
    return t.second ? &t.first : nullptr;
  }

 private:
  Bpe() = default;
  void merge_word(std::string_view word, std::vector<std::int32_t>& out) const;

  StringIdMap vocab_;
  std::vector<std::pair<std::string, bool>> tokens_;  // by id; false: no token has this id
  // (left id << 32 | right id) -> (rank, merged id).
  std::unordered_map<std::uint64_t, std::pair<std::int32_t, std::int32_t>> merges_;
  std::optional<std::int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;

  // Words of up to kMaxCachedWord bytes and their ids; cleared when it reaches kCacheCapacity
  // (tokenizers' own capacity), which bounds its memory on unbounded input.
  static constexpr std::size_t kMaxCachedWord = 256;
  static constexpr std::size_t kCacheCapacity = 10000;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>, StringHash, std::equal_to<>>
      cache_;
};

}  // namespace numesh::models::detail
