#include "bpe.hpp"

#include <fmt/format.h>

#include <queue>

#include "../strict_json.hpp"
#include "byte_level.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::models::detail {
namespace {

std::uint64_t pair_key(std::int32_t left, std::int32_t right) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32U) |
         static_cast<std::uint32_t>(right);
}

}  // namespace

Bpe::Bpe(Bpe&& other) noexcept
    : vocab_(std::move(other.vocab_)),
      tokens_(std::move(other.tokens_)),
      merges_(std::move(other.merges_)),
      unk_id_(other.unk_id_),
      fuse_unk_(other.fuse_unk_),
      ignore_merges_(other.ignore_merges_) {}

Bpe Bpe::from_json(const nlohmann::json& model, std::string_view source) {
  NUMESH_CHECK(model.is_object(), ValueError, "{}: model is {}, expected an object", source,
               model.is_null() ? "null" : model.type_name());
  const auto field = [&](std::string_view key) -> const nlohmann::json& {
    static const nlohmann::json null_value;
    const auto it = model.find(key);
    return it == model.end() ? null_value : *it;
  };
  // A type that is not a string is named by its JSON (json::value would throw type_error:
  // found by tokenizer_json_fuzz).
  const nlohmann::json& type_json = field("type");
  const std::string type = type_json.is_string() ? type_json.get<std::string>() : type_json.dump();
  NUMESH_CHECK(type == "BPE", ValueError, "{}: model type '{}' is not supported (BPE)", source,
               type);
  const auto boolean = [&](std::string_view key) {
    const auto& v = field(key);
    if (v.is_null()) return false;
    NUMESH_CHECK(v.is_boolean(), ValueError, "{}: model field '{}' is {}, expected true or false",
                 source, key, v.dump());
    return v.get<bool>();
  };
  NUMESH_CHECK(!boolean("byte_fallback"), ValueError,
               "{}: model byte_fallback true is not supported (SentencePiece-style BPE; numesh "
               "reads byte-level BPE)",
               source);
  NUMESH_CHECK(field("dropout").is_null(), ValueError,
               "{}: model dropout {} is not supported (null)", source, field("dropout").dump());
  for (const std::string_view key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const auto& v = field(key);
    NUMESH_CHECK(v.is_null() || (v.is_string() && v.get<std::string>().empty()), ValueError,
                 "{}: model {} {} is not supported (null or \"\")", source, key, v.dump());
  }

  Bpe bpe;
  bpe.fuse_unk_ = boolean("fuse_unk");
  bpe.ignore_merges_ = boolean("ignore_merges");

  const auto& vocab = field("vocab");
  NUMESH_CHECK(vocab.is_object(), ValueError, "{}: model vocab is {}, expected an object", source,
               vocab.is_null() ? "missing" : vocab.type_name());
  std::int64_t size = 0;
  for (const auto& [token, id] : vocab.items()) {
    NUMESH_CHECK(
        id.is_number_integer() && id.get<std::int64_t>() >= 0 && id.get<std::int64_t>() < INT32_MAX,
        ValueError, "{}: model vocab id of '{}' is {}, expected a non-negative integer", source,
        token, id.dump());
    size = std::max(size, id.get<std::int64_t>() + 1);
  }
  bpe.tokens_.resize(static_cast<std::size_t>(size));
  bpe.vocab_.reserve(vocab.size());
  for (const auto& [token, id_json] : vocab.items()) {
    const auto id = id_json.get<std::int32_t>();
    auto& slot = bpe.tokens_[static_cast<std::size_t>(id)];
    NUMESH_CHECK(!slot.second, ValueError, "{}: model vocab gives id {} to both '{}' and '{}'",
                 source, id, std::min(slot.first, token), std::max(slot.first, token));
    slot = {token, true};
    bpe.vocab_.emplace(token, id);
  }

  const auto& merges = field("merges");
  NUMESH_CHECK(merges.is_array(), ValueError, "{}: model merges is {}, expected an array", source,
               merges.is_null() ? "missing" : merges.type_name());
  bpe.merges_.reserve(merges.size());
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& m = merges[rank];
    std::string left;
    std::string right;
    if (m.is_string()) {
      // "a b": byte-level tokens never hold a space (it is "Ġ"), so exactly one separates them.
      const auto text = m.get<std::string>();
      const auto space = text.find(' ');
      NUMESH_CHECK(space != std::string::npos && space > 0 && space + 1 < text.size() &&
                       text.find(' ', space + 1) == std::string::npos,
                   ValueError, "{}: model merge {} is {}, expected \"a b\" or [\"a\", \"b\"]",
                   source, rank, m.dump());
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else {
      NUMESH_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
                   ValueError, "{}: model merge {} is {}, expected \"a b\" or [\"a\", \"b\"]",
                   source, rank, json_excerpt(Json(m)));
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    }
    const auto find = [&](const std::string& token, std::string_view what) {
      const auto it = bpe.vocab_.find(token);
      NUMESH_CHECK(it != bpe.vocab_.end(), ValueError,
                   "{}: model merge {} ('{} {}'): {} '{}' is not in the vocab", source, rank, left,
                   right, what, token);
      return it->second;
    };
    const auto left_id = find(left, "token");
    const auto right_id = find(right, "token");
    const auto merged_id = find(left + right, "merged token");
    // As tokenizers' builder: a pair listed twice keeps its last rank.
    bpe.merges_[pair_key(left_id, right_id)] = {static_cast<std::int32_t>(rank), merged_id};
  }

  if (const auto& unk = field("unk_token"); !unk.is_null()) {
    NUMESH_CHECK(unk.is_string(), ValueError, "{}: model unk_token is {}, expected a string",
                 source, unk.dump());
    const auto it = bpe.vocab_.find(unk.get<std::string>());
    NUMESH_CHECK(it != bpe.vocab_.end(), ValueError, "{}: model unk_token '{}' is not in the vocab",
                 source, unk.get<std::string>());
    bpe.unk_id_ = it->second;
  }
  return bpe;
}

void Bpe::tokenize(std::string_view word, std::vector<std::int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    // Llama 3: a word that is a token is that token, whatever the merges would make of it.
    if (const auto it = vocab_.find(word); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWord;
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    if (const auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const std::size_t first = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(
        std::string(word),
        std::vector<std::int32_t>(out.begin() + static_cast<std::ptrdiff_t>(first), out.end()));
  }
}

void Bpe::merge_word(std::string_view word, std::vector<std::int32_t>& out) const {
  // The word's symbols as a linked list (tokenizers' Word): merged-away symbols get len 0.
  struct Symbol {
    std::int32_t id;
    std::int32_t prev;
    std::int32_t next;
    std::size_t len;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  std::optional<std::pair<std::int32_t, std::size_t>> unk;  // a pending unknown run: id, bytes
  const auto add = [&](std::int32_t id, std::size_t len) {
    const auto index = static_cast<std::int32_t>(symbols.size());
    if (index > 0) symbols.back().next = index;
    symbols.push_back({id, index - 1, -1, len});
  };
  for (std::size_t i = 0; i < word.size();) {
    const std::size_t start = i;
    (void)next_code_point(word, i);
    const std::string_view ch = word.substr(start, i - start);
    if (const auto it = vocab_.find(ch); it != vocab_.end()) {
      if (unk) add(unk->first, unk->second);
      unk.reset();
      add(it->second, ch.size());
    } else if (unk_id_) {
      // tokenizers' BPE::merge_word: unknown characters become unk_token (one for a whole run
      // with fuse_unk); without an unk_token they are dropped.
      if (unk && fuse_unk_) {
        unk->second += ch.size();
      } else {
        if (unk) add(unk->first, unk->second);
        unk = std::make_pair(*unk_id_, ch.size());
      }
    }
  }
  if (unk) add(unk->first, unk->second);

  struct Candidate {
    std::int32_t rank;
    std::int32_t pos;
    std::int32_t merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto push = [&](std::int32_t pos) {
    const auto next = symbols[static_cast<std::size_t>(pos)].next;
    if (next < 0) return;
    const auto it = merges_.find(pair_key(symbols[static_cast<std::size_t>(pos)].id,
                                          symbols[static_cast<std::size_t>(next)].id));
    if (it != merges_.end()) queue.push({it->second.first, pos, it->second.second});
  };
  for (std::int32_t pos = 0; pos + 1 < static_cast<std::int32_t>(symbols.size()); ++pos) push(pos);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<std::size_t>(top.pos)];
    // Stale entries: the left symbol was merged into its neighbour, or the pair changed since.
    if (left.len == 0 || left.next < 0) continue;
    Symbol& right = symbols[static_cast<std::size_t>(left.next)];
    const auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.second != top.merged) continue;
    left.id = top.merged;
    left.len += right.len;
    left.next = right.next;
    right.len = 0;
    if (left.next >= 0) symbols[static_cast<std::size_t>(left.next)].prev = top.pos;
    if (left.prev >= 0) push(left.prev);
    push(top.pos);
  }
  for (const Symbol& s : symbols) {
    if (s.len > 0) out.push_back(s.id);
  }
}

}  // namespace numesh::models::detail
