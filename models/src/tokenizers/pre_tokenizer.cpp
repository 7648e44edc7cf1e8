#include "pre_tokenizer.hpp"

#include <fmt/format.h>
#include <oniguruma.h>

#include <mutex>

#include "../strict_json.hpp"
#include "byte_level.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::models::detail {

struct OnigRegex::Compiled {
  regex_t* regex = nullptr;
  ~Compiled() {
    if (regex != nullptr) onig_free(regex);
  }
};

OnigRegex::OnigRegex(std::string_view pattern, std::string_view source, std::string_view what)
    : compiled_(std::make_unique<Compiled>()) {
  static std::once_flag init;
  std::call_once(init, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
  OnigErrorInfo info;
  const auto* begin = reinterpret_cast<const OnigUChar*>(pattern.data());
  // ONIG_SYNTAX_DEFAULT and no options: what onig::Regex::new, which tokenizers calls, uses.
  const int rc = onig_new(&compiled_->regex, begin, begin + pattern.size(), ONIG_OPTION_NONE,
                          ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &info);
  if (rc != ONIG_NORMAL) {
    compiled_->regex = nullptr;
    OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(message, rc, &info);
    throw ValueError(fmt::format("{}: {} regex '{}' does not compile: {}", source, what, pattern,
                                 reinterpret_cast<const char*>(message)));
  }
}

OnigRegex::OnigRegex(OnigRegex&&) noexcept = default;
OnigRegex& OnigRegex::operator=(OnigRegex&&) noexcept = default;
OnigRegex::~OnigRegex() = default;

void OnigRegex::split(std::string_view text, std::vector<std::string_view>& out, bool keep_matches,
                      bool keep_gaps) const {
  // One region per call: a compiled regex_t is only read by onig_search, so concurrent calls on
  // one regex are safe.
  OnigRegion* region = onig_region_new();
  const auto* str = reinterpret_cast<const OnigUChar*>(text.data());
  const auto* end = str + text.size();
  std::size_t pos = 0;   // where the next search starts
  std::size_t prev = 0;  // the end of the last piece emitted
  try {
    while (pos <= text.size()) {
      // The whole text is the subject (so lookbehind and \b see what is before `pos`); the
      // search scans forward from `pos`, which keeps the whole split linear in the text.
      const int at =
          onig_search(compiled_->regex, str, end, str + pos, end, region, ONIG_OPTION_NONE);
      if (at < 0) {
        NUMESH_CHECK(at == ONIG_MISMATCH, Error, "tokenizer: Oniguruma search failed ({})", at);
        break;
      }
      const auto start = static_cast<std::size_t>(region->beg[0]);
      const auto stop = static_cast<std::size_t>(region->end[0]);
      if (start == stop) {
        // An empty match splits nothing; step over one character, as onig's find_iter does.
        std::size_t next = stop;
        if (next < text.size()) {
          ++next;
          while (next < text.size() && (static_cast<unsigned char>(text[next]) & 0xC0U) == 0x80U)
            ++next;
        } else {
          break;
        }
        pos = next;
        continue;
      }
      if (start > prev && keep_gaps) out.push_back(text.substr(prev, start - prev));
      if (keep_matches) out.push_back(text.substr(start, stop - start));
      prev = stop;
      pos = stop;
    }
  } catch (...) {
    onig_region_free(region, 1);
    throw;
  }
  onig_region_free(region, 1);
  if (prev < text.size() && keep_gaps) out.push_back(text.substr(prev));
}

namespace {

std::string type_of(const nlohmann::json& step) {
  if (!step.is_object() || !step.contains("type") || !step["type"].is_string()) return "";
  return step["type"].get<std::string>();
}

bool flag(const nlohmann::json& step, std::string_view key, bool fallback, std::string_view source,
          std::string_view where) {
  const auto it = step.find(key);
  if (it == step.end() || it->is_null()) return fallback;
  NUMESH_CHECK(it->is_boolean(), ValueError, "{}: {} field '{}' is {}, expected true or false",
               source, where, key, it->dump());
  return it->get<bool>();
}

}  // namespace

PreTokenizer PreTokenizer::from_json(const nlohmann::json& json, std::string_view source) {
  NUMESH_CHECK(!json.is_null(), ValueError,
               "{}: pre_tokenizer null is not supported (byte-level BPE needs a ByteLevel "
               "pre-tokenizer)",
               source);
  std::vector<nlohmann::json> steps;
  if (type_of(json) == "Sequence") {
    const auto it = json.find("pretokenizers");
    NUMESH_CHECK(it != json.end() && it->is_array(), ValueError,
                 "{}: pre_tokenizer Sequence has no 'pretokenizers' array", source);
    steps.assign(it->begin(), it->end());
  } else {
    steps.push_back(json);
  }
  PreTokenizer result;
  bool byte_level = false;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const auto& step = steps[i];
    const std::string type = type_of(step);
    NUMESH_CHECK(!byte_level, ValueError,
                 "{}: pre_tokenizer step {} ('{}') comes after ByteLevel; numesh supports Split "
                 "steps followed by one ByteLevel step",
                 source, i, type);
    if (type == "Split") {
      const std::string where = fmt::format("pre_tokenizer step {} (Split)", i);
      const auto behavior = step.value("behavior", std::string());
      NUMESH_CHECK(behavior == "Isolated" || behavior == "Removed", ValueError,
                   "{}: {} behavior '{}' is not supported (Isolated, Removed)", source, where,
                   behavior);
      // tokenizers' Split: invert swaps what is a delimiter (a match, or a gap between
      // matches); Isolated keeps both kinds as pieces, Removed drops the delimiters (GPT-4o's
      // file: Removed with invert, so only the matches are kept).
      const bool invert = flag(step, "invert", false, source, where);
      const auto pattern = step.find("pattern");
      NUMESH_CHECK(pattern != step.end() && pattern->is_object() && pattern->size() == 1,
                   ValueError,
                   "{}: {} pattern is {}, expected {{\"Regex\": ...}} or "
                   "{{\"String\": ...}}",
                   source, where, pattern == step.end() ? "missing" : json_excerpt(Json(*pattern)));
      Step s;
      if (behavior == "Removed") (invert ? s.keep_gaps : s.keep_matches) = false;
      if (const auto regex = pattern->find("Regex");
          regex != pattern->end() && regex->is_string()) {
        s.regex = std::make_unique<OnigRegex>(regex->get<std::string>(), source, where);
      } else if (const auto literal = pattern->find("String");
                 literal != pattern->end() && literal->is_string() &&
                 !literal->get<std::string>().empty()) {
        s.literal = literal->get<std::string>();
      } else {
        throw ValueError(
            fmt::format("{}: {} pattern is {}, expected {{\"Regex\": ...}} or a "
                        "non-empty {{\"String\": ...}}",
                        source, where, json_excerpt(Json(*pattern))));
      }
      result.splits_.push_back(std::move(s));
    } else if (type == "ByteLevel") {
      const std::string where = fmt::format("pre_tokenizer step {} (ByteLevel)", i);
      result.add_prefix_space_ = flag(step, "add_prefix_space", true, source, where);
      // trim_offsets changes offsets only, never ids.
      (void)flag(step, "trim_offsets", true, source, where);
      if (flag(step, "use_regex", true, source, where)) {
        result.byte_level_regex_ = std::make_unique<OnigRegex>(kGpt2Pattern, source, where);
      }
      byte_level = true;
    } else {
      throw ValueError(
          fmt::format("{}: pre_tokenizer type '{}' is not supported (Sequence, Split, ByteLevel)",
                      source, type.empty() ? json_excerpt(Json(step)) : type));
    }
  }
  NUMESH_CHECK(byte_level, ValueError,
               "{}: pre_tokenizer has no ByteLevel step; numesh reads byte-level BPE only", source);
  return result;
}

void PreTokenizer::split(std::string_view text, std::vector<std::string>& out) const {
  std::vector<std::string_view> pieces{text};
  std::vector<std::string_view> next;
  for (const Step& step : splits_) {
    next.clear();
    for (const std::string_view piece : pieces) {
      if (step.regex) {
        step.regex->split(piece, next, step.keep_matches, step.keep_gaps);
        continue;
      }
      std::size_t prev = 0;
      for (std::size_t at = piece.find(step.literal); at != std::string_view::npos;
           at = piece.find(step.literal, prev)) {
        if (at > prev && step.keep_gaps) next.push_back(piece.substr(prev, at - prev));
        if (step.keep_matches) next.push_back(piece.substr(at, step.literal.size()));
        prev = at + step.literal.size();
      }
      if (prev < piece.size() && step.keep_gaps) next.push_back(piece.substr(prev));
    }
    pieces.swap(next);
  }
  // ByteLevel: a space in front of each piece that lacks one (add_prefix_space), GPT-2's split
  // (use_regex), then every byte through the table.
  std::string prefixed;
  for (const std::string_view piece : pieces) {
    if (piece.empty()) continue;
    std::string_view whole = piece;
    if (add_prefix_space_ && piece.front() != ' ') {
      prefixed = " ";
      prefixed += piece;
      whole = prefixed;
    }
    next.clear();
    if (byte_level_regex_) {
      byte_level_regex_->split(whole, next);
    } else {
      next.push_back(whole);
    }
    for (const std::string_view word : next) {
      std::string mapped;
      mapped.reserve(word.size() * 2);
      append_byte_level(word, mapped);
      out.push_back(std::move(mapped));
    }
  }
}

}  // namespace numesh::models::detail
