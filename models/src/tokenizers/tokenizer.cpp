#include "numesh/models/tokenizers/tokenizer.hpp"

#include <fmt/format.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>

#include "../strict_json.hpp"
#include "bpe.hpp"
#include "byte_level.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "pre_tokenizer.hpp"

namespace numesh::models {
namespace {

using detail::Bpe;
using detail::json_excerpt;
using detail::PreTokenizer;

// Rust's char::is_whitespace (the Unicode White_Space property), which tokenizers' lstrip and
// rstrip use; the property is these 25 code points and has not changed since Unicode 6.
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// The last code point of text[0, end) (valid UTF-8) and where it starts.
char32_t previous_code_point(std::string_view text, std::size_t end, std::size_t& start) {
  start = end - 1;
  while (start > 0 && (static_cast<std::uint8_t>(text[start]) & 0xC0U) == 0x80U) --start;
  std::size_t i = start;
  return detail::next_code_point(text, i);
}

}  // namespace

// Named rather than anonymous: a member of a class with linkage must have a type with linkage.
namespace detail {

// The added tokens of one kind (matched in the raw or in the normalised text): finds the
// leftmost match, and of those starting there the longest, as tokenizers' AddedVocabulary does
// with an Aho-Corasick automaton in LeftmostLongest mode. Tokens are bucketed by first byte
// (longest first), which keeps the scan linear in the text for the few hundred tokens models
// have, nearly all starting with '<'.
class AddedMatcher {
 public:
  void add(const AddedToken* token) { buckets_[first_byte(token)].push_back(token); }
  void finish() {
    for (auto& bucket : buckets_) {
      std::stable_sort(bucket.begin(), bucket.end(), [](const AddedToken* a, const AddedToken* b) {
        return a->content.size() > b->content.size();
      });
    }
  }
  bool empty() const {
    return std::all_of(buckets_.begin(), buckets_.end(), [](const auto& b) { return b.empty(); });
  }
  // The next match at or after `from`: its start and token, or nullptr.
  const AddedToken* find(std::string_view text, std::size_t from, std::size_t& at) const {
    for (std::size_t i = from; i < text.size(); ++i) {
      for (const AddedToken* token : buckets_[static_cast<std::uint8_t>(text[i])]) {
        if (text.substr(i).starts_with(token->content)) {
          at = i;
          return token;
        }
      }
    }
    return nullptr;
  }

 private:
  static std::uint8_t first_byte(const AddedToken* t) {
    return static_cast<std::uint8_t>(t->content.front());
  }
  std::array<std::vector<const AddedToken*>, 256> buckets_;
};

}  // namespace detail

namespace {

// One piece of the text on its way to ids: a matched added token, or text still to tokenize.
struct Segment {
  const AddedToken* token = nullptr;
  std::string_view text;
};

// Cuts `text` at the added tokens of `matcher` (tokenizers' AddedVocabulary::find_matches):
// lstrip takes the whitespace before a match into it (never past the previous match), rstrip the
// whitespace after it.
void split_added(std::string_view text, const detail::AddedMatcher& matcher,
                 std::vector<Segment>& out) {
  std::size_t emitted = 0;  // the end of the last segment
  std::size_t search = 0;   // where the matcher looks next: matches never overlap
  std::size_t at = 0;
  while (const AddedToken* token = matcher.find(text, search, at)) {
    std::size_t start = at;
    std::size_t stop = at + token->content.size();
    search = stop;
    if (token->lstrip) {
      std::size_t s = start;
      std::size_t before = 0;
      while (s > 0 && is_white_space(previous_code_point(text, s, before))) s = before;
      start = std::max(s, emitted);
    }
    if (token->rstrip) {
      while (stop < text.size()) {
        std::size_t next = stop;
        if (!is_white_space(detail::next_code_point(text, next))) break;
        stop = next;
      }
    }
    if (emitted < start) out.push_back({nullptr, text.substr(emitted, start - emitted)});
    out.push_back({token, text.substr(start, stop - start)});
    emitted = stop;
  }
  if (emitted < text.size()) out.push_back({nullptr, text.substr(emitted)});
}

}  // namespace

struct Tokenizer::Impl {
  std::string source;
  Bpe bpe;
  PreTokenizer pre_tokenizer;
  bool nfc = false;
  std::vector<AddedToken> added;
  // By id: the added token of an id (nullptr: the model's token or none).
  std::vector<const AddedToken*> added_by_id;
  detail::AddedMatcher raw_matcher;         // normalized false: matched before normalisation
  detail::AddedMatcher normalized_matcher;  // normalized true: matched in the normalised text
  // The post-processor's template for one sequence: ids before and after it (empty: none).
  std::vector<std::int32_t> prefix_ids;
  std::vector<std::int32_t> suffix_ids;
  std::int64_t vocab_size = 0;

  Impl(std::string s, Bpe b, PreTokenizer p)
      : source(std::move(s)), bpe(std::move(b)), pre_tokenizer(std::move(p)) {}

  void parse_normalizer(const nlohmann::json& json);
  void parse_added_tokens(const nlohmann::json& json);
  void parse_post_processor(const nlohmann::json& json, std::string_view where);
  void parse_decoder(const nlohmann::json& json);
  void tokenize(std::string_view text, std::vector<std::int32_t>& ids) const;
};

namespace {

std::string type_name(const nlohmann::json& json) {
  if (json.is_object()) {
    if (const auto it = json.find("type"); it != json.end() && it->is_string()) {
      return it->get<std::string>();
    }
  }
  return json_excerpt(detail::Json(json));
}

bool bool_field(const nlohmann::json& object, std::string_view key, bool fallback,
                std::string_view source, std::string_view where) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  NUMESH_CHECK(it->is_boolean(), ValueError, "{}: {} field '{}' is {}, expected true or false",
               source, where, key, it->dump());
  return it->get<bool>();
}

}  // namespace

void Tokenizer::Impl::parse_normalizer(const nlohmann::json& json) {
  if (json.is_null()) return;
  const std::string type = type_name(json);
  if (type == "Sequence") {
    // DeepSeek V3 has an empty Sequence: no normalisation. NFC twice is NFC once.
    const auto it = json.find("normalizers");
    NUMESH_CHECK(it != json.end() && it->is_array(), ValueError,
                 "{}: normalizer Sequence has no 'normalizers' array", source);
    for (const auto& step : *it) parse_normalizer(step);
    return;
  }
  NUMESH_CHECK(type == "NFC", ValueError,
               "{}: normalizer type '{}' is not supported (null, NFC, or a Sequence of NFC)",
               source, type);
  nfc = true;
}

void Tokenizer::Impl::parse_added_tokens(const nlohmann::json& json) {
  if (json.is_null()) return;
  NUMESH_CHECK(json.is_array(), ValueError, "{}: added_tokens is {}, expected an array", source,
               json.type_name());
  added.reserve(json.size());
  for (std::size_t i = 0; i < json.size(); ++i) {
    const auto& entry = json[i];
    const std::string where = fmt::format("added_tokens[{}]", i);
    NUMESH_CHECK(entry.is_object(), ValueError, "{}: {} is {}, expected an object", source, where,
                 json_excerpt(detail::Json(entry)));
    const auto id = entry.find("id");
    NUMESH_CHECK(id != entry.end() && id->is_number_integer() && id->get<std::int64_t>() >= 0 &&
                     id->get<std::int64_t>() < INT32_MAX,
                 ValueError, "{}: {} id is {}, expected a non-negative integer", source, where,
                 id == entry.end() ? "missing" : id->dump());
    const auto content = entry.find("content");
    NUMESH_CHECK(
        content != entry.end() && content->is_string() && !content->get<std::string>().empty(),
        ValueError, "{}: {} content is {}, expected a non-empty string", source, where,
        content == entry.end() ? "missing" : content->dump());
    AddedToken token;
    token.id = id->get<std::int32_t>();
    token.content = content->get<std::string>();
    token.special = bool_field(entry, "special", false, source, where);
    token.lstrip = bool_field(entry, "lstrip", false, source, where);
    token.rstrip = bool_field(entry, "rstrip", false, source, where);
    token.normalized = bool_field(entry, "normalized", !token.special, source, where);
    NUMESH_CHECK(!bool_field(entry, "single_word", false, source, where), ValueError,
                 "{}: {} ('{}') single_word true is not supported", source, where, token.content);
    for (const AddedToken& other : added) {
      NUMESH_CHECK(other.id != token.id, ValueError,
                   "{}: {} ('{}') has id {}, which '{}' has already", source, where, token.content,
                   token.id, other.content);
      NUMESH_CHECK(other.content != token.content, ValueError,
                   "{}: {} '{}' is listed twice (ids {} and {})", source, where, token.content,
                   other.id, token.id);
    }
    added.push_back(std::move(token));
  }
}

void Tokenizer::Impl::parse_post_processor(const nlohmann::json& json, std::string_view where) {
  if (json.is_null()) return;
  const std::string type = type_name(json);
  if (type == "ByteLevel") return;  // it trims offsets only; ids are untouched
  if (type == "Sequence") {
    const auto it = json.find("processors");
    NUMESH_CHECK(it != json.end() && it->is_array(), ValueError,
                 "{}: {} Sequence has no 'processors' array", source, where);
    for (std::size_t i = 0; i < it->size(); ++i) {
      parse_post_processor((*it)[i], fmt::format("{}.processors[{}]", where, i));
    }
    return;
  }
  NUMESH_CHECK(type == "TemplateProcessing", ValueError,
               "{}: {} type '{}' is not supported (TemplateProcessing, ByteLevel, Sequence)",
               source, where, type);
  NUMESH_CHECK(prefix_ids.empty() && suffix_ids.empty(), ValueError,
               "{}: {} is a second TemplateProcessing; numesh applies one", source, where);
  const auto single = json.find("single");
  NUMESH_CHECK(single != json.end() && single->is_array(), ValueError,
               "{}: {} has no 'single' template array", source, where);
  const auto specials = json.find("special_tokens");
  bool seen_sequence = false;
  for (const auto& piece : *single) {
    if (piece.contains("Sequence")) {
      const auto& seq = piece["Sequence"];
      NUMESH_CHECK(!seen_sequence && seq.value("id", std::string()) == "A", ValueError,
                   "{}: {} single template piece {} is not supported (one Sequence A)", source,
                   where, json_excerpt(detail::Json(piece)));
      seen_sequence = true;
      continue;
    }
    NUMESH_CHECK(piece.contains("SpecialToken") && piece["SpecialToken"].contains("id") &&
                     piece["SpecialToken"]["id"].is_string(),
                 ValueError,
                 "{}: {} single template piece {} is not supported (SpecialToken or "
                 "Sequence)",
                 source, where, json_excerpt(detail::Json(piece)));
    const auto name = piece["SpecialToken"]["id"].get<std::string>();
    NUMESH_CHECK(specials != json.end() && specials->is_object() && specials->contains(name) &&
                     (*specials)[name].contains("ids") && (*specials)[name]["ids"].is_array(),
                 ValueError, "{}: {} special token '{}' has no ids in special_tokens", source,
                 where, name);
    for (const auto& id : (*specials)[name]["ids"]) {
      NUMESH_CHECK(id.is_number_integer() && id.get<std::int64_t>() >= 0 &&
                       id.get<std::int64_t>() < INT32_MAX,
                   ValueError,
                   "{}: {} special token '{}' has id {}, expected a non-negative "
                   "integer",
                   source, where, name, id.dump());
      (seen_sequence ? suffix_ids : prefix_ids).push_back(id.get<std::int32_t>());
    }
  }
  NUMESH_CHECK(seen_sequence, ValueError, "{}: {} single template has no Sequence A", source,
               where);
}

void Tokenizer::Impl::parse_decoder(const nlohmann::json& json) {
  const std::string type = json.is_null() ? "null" : type_name(json);
  NUMESH_CHECK(type == "ByteLevel", ValueError,
               "{}: decoder type '{}' is not supported (ByteLevel)", source, type);
}

void Tokenizer::Impl::tokenize(std::string_view text, std::vector<std::int32_t>& ids) const {
  std::vector<Segment> raw;
  split_added(text, raw_matcher, raw);
  std::vector<std::string> words;
  std::string normalized;
  std::vector<Segment> pieces;
  for (const Segment& segment : raw) {
    if (segment.token != nullptr) {
      ids.push_back(segment.token->id);
      continue;
    }
    std::string_view part = segment.text;
    if (nfc) {
      // utf8proc's NFC (Unicode's composition tables; Rust's unicode-normalization crate,
      // which tokenizers uses, implements the same algorithm).
      utf8proc_uint8_t* composed = nullptr;
      const auto len =
          utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(part.data()),
                       static_cast<utf8proc_ssize_t>(part.size()), &composed,
                       static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
      NUMESH_CHECK(len >= 0, ValueError, "tokenizer: NFC normalisation failed: {}",
                   utf8proc_errmsg(len));
      normalized.assign(reinterpret_cast<const char*>(composed), static_cast<std::size_t>(len));
      std::free(composed);
      part = normalized;
    }
    pieces.clear();
    split_added(part, normalized_matcher, pieces);
    for (const Segment& piece : pieces) {
      if (piece.token != nullptr) {
        ids.push_back(piece.token->id);
        continue;
      }
      words.clear();
      pre_tokenizer.split(piece.text, words);
      for (const std::string& word : words) bpe.tokenize(word, ids);
    }
  }
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::filesystem::path& path) {
  std::error_code ec;
  const auto file = std::filesystem::is_directory(path, ec) ? path / "tokenizer.json" : path;
  std::ifstream in(file, std::ios::binary);
  NUMESH_CHECK(in.good(), ValueError, "{}: cannot open the tokenizer file", file.string());
  std::ostringstream text;
  text << in.rdbuf();
  NUMESH_CHECK(!in.bad(), ValueError, "{}: cannot read the tokenizer file", file.string());
  return parse(text.str(), file.string());
}

Tokenizer Tokenizer::parse(std::string_view json_text, std::string_view source) {
  // Every field is checked by name before it is read; this net turns a value of a type some
  // check missed into the same kind of error, never nlohmann's own exception (the contract
  // tokenizer_json_fuzz holds the parser to).
  try {
    return parse_checked(json_text, source);
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(
        fmt::format("{}: the tokenizer has a value of the wrong type: {}", source, e.what()));
  }
}

Tokenizer Tokenizer::parse_checked(std::string_view json_text, std::string_view source) {
  const nlohmann::json json = detail::parse_strict_json_map(json_text, source, "the tokenizer");
  NUMESH_CHECK(json.is_object(), ValueError, "{}: the tokenizer is {}, expected an object", source,
               json.type_name());
  const auto field = [&](std::string_view key) -> const nlohmann::json& {
    static const nlohmann::json null_value;
    const auto it = json.find(key);
    return it == json.end() ? null_value : *it;
  };
  // Truncation and padding change the ids an encode gives; numesh encodes whole texts.
  for (const std::string_view key : {"truncation", "padding"}) {
    NUMESH_CHECK(field(key).is_null(), ValueError, "{}: {} {} is not supported (null)", source, key,
                 json_excerpt(detail::Json(field(key))));
  }
  // Everything is checked before anything is used: model first (what the rest refers to).
  auto bpe = Bpe::from_json(field("model"), source);
  auto pre = PreTokenizer::from_json(field("pre_tokenizer"), source);
  auto impl = std::make_unique<Impl>(std::string(source), std::move(bpe), std::move(pre));
  impl->parse_normalizer(field("normalizer"));
  impl->parse_added_tokens(field("added_tokens"));
  impl->parse_post_processor(field("post_processor"), "post_processor");
  impl->parse_decoder(field("decoder"));

  impl->vocab_size = impl->bpe.size();
  for (const AddedToken& t : impl->added) {
    impl->vocab_size = std::max<std::int64_t>(impl->vocab_size, std::int64_t{t.id} + 1);
  }
  impl->added_by_id.assign(static_cast<std::size_t>(impl->vocab_size), nullptr);
  for (const AddedToken& t : impl->added) {
    impl->added_by_id[static_cast<std::size_t>(t.id)] = &t;
    (t.normalized ? impl->normalized_matcher : impl->raw_matcher).add(&t);
  }
  impl->raw_matcher.finish();
  impl->normalized_matcher.finish();
  for (const auto* ids : {&impl->prefix_ids, &impl->suffix_ids}) {
    for (const std::int32_t id : *ids) {
      NUMESH_CHECK(
          id < impl->vocab_size && (impl->added_by_id[static_cast<std::size_t>(id)] != nullptr ||
                                    (id < impl->bpe.size() && impl->bpe.token(id) != nullptr)),
          ValueError,
          "{}: post_processor special token id {} is not in the vocabulary "
          "(size {})",
          source, id, impl->vocab_size);
    }
  }
  return Tokenizer(std::move(impl));
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (const auto bad = detail::find_invalid_utf8(text)) {
    if (*bad == text.size()) {
      throw ValueError(fmt::format(
          "tokenizer: the text is not valid UTF-8 (it ends inside a character at offset {})",
          text.size()));
    }
    throw ValueError(
        fmt::format("tokenizer: the text is not valid UTF-8 (byte 0x{:02x} at "
                    "offset {})",
                    static_cast<std::uint8_t>(text[*bad]), *bad));
  }
  std::vector<std::int32_t> ids;
  if (add_special_tokens) ids = impl_->prefix_ids;
  impl_->tokenize(text, ids);
  if (add_special_tokens) ids.insert(ids.end(), impl_->suffix_ids.begin(), impl_->suffix_ids.end());
  return ids;
}

std::string Tokenizer::decode(std::span<const std::int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (std::size_t pos = 0; pos < ids.size(); ++pos) {
    const std::int32_t id = ids[pos];
    NUMESH_CHECK(id >= 0 && id < impl_->vocab_size, IndexError,
                 "tokenizer: token id {} at position {} is outside the vocabulary (size {})", id,
                 pos, impl_->vocab_size);
    std::string_view token;
    if (const AddedToken* added = impl_->added_by_id[static_cast<std::size_t>(id)]) {
      if (skip_special_tokens && added->special) continue;
      token = added->content;
    } else {
      const std::string* model_token = id < impl_->bpe.size() ? impl_->bpe.token(id) : nullptr;
      NUMESH_CHECK(model_token != nullptr, IndexError,
                   "tokenizer: token id {} at position {} has no token (vocabulary size {})", id,
                   pos, impl_->vocab_size);
      token = *model_token;
    }
    // tokenizers' ByteLevel decoder: a token whose characters are all in GPT-2's table becomes
    // their bytes; any other keeps its own bytes.
    if (!detail::append_byte_level_decoded(token, bytes)) bytes.append(token);
  }
  return detail::utf8_lossy(bytes);
}

std::int64_t Tokenizer::vocab_size() const noexcept { return impl_->vocab_size; }

std::optional<std::int32_t> Tokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& t : impl_->added) {
    if (t.content == token) return t.id;
  }
  const auto& vocab = impl_->bpe.vocab();
  if (const auto it = vocab.find(token); it != vocab.end()) return it->second;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::id_to_token(std::int32_t id) const {
  if (id < 0 || id >= impl_->vocab_size) return std::nullopt;
  if (const AddedToken* added = impl_->added_by_id[static_cast<std::size_t>(id)]) {
    return added->content;
  }
  if (id < impl_->bpe.size()) {
    if (const std::string* t = impl_->bpe.token(id)) return *t;
  }
  return std::nullopt;
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const noexcept { return impl_->added; }

}  // namespace numesh::models
