#include "strict_json.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "numesh/core/error.hpp"
#include "utf8.hpp"

namespace numesh::models::detail {

std::optional<std::size_t> find_invalid_utf8(std::string_view text) noexcept {
  std::size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<std::uint8_t>(text[i]);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    const Utf8Lead rule = utf8_lead(lead);
    if (!rule.starts) return i;
    const std::size_t needed = rule.needed;
    for (std::size_t k = 1; k <= needed; ++k) {
      if (i + k >= text.size()) return text.size();
      if (!utf8_continues(rule, k, static_cast<std::uint8_t>(text[i + k]))) return i + k;
    }
    i += needed + 1;
  }
  return std::nullopt;
}

namespace {

// The one implementation of both parse_strict_json flavours; J is the document type.
template <typename J>
J parse_strict(std::string_view text, std::string_view where, std::string_view what) {
  if (const auto bad = find_invalid_utf8(text)) {
    if (*bad == text.size()) {
      throw ValueError(
          fmt::format("{}: {} is not valid UTF-8 (it ends inside a character)", where, what));
    }
    throw ValueError(fmt::format("{}: {} is not valid UTF-8 (byte 0x{:02x} at offset {})", where,
                                 what, static_cast<std::uint8_t>(text[*bad]), *bad));
  }

  // One frame per open object: the keys seen so far and the key the object is the value of.
  struct Frame {
    std::set<std::string, std::less<>> keys;
    std::string owner;
  };
  std::vector<Frame> objects;
  std::string last_key;
  int nesting = 0;
  const auto check_keys = [&](int /*depth*/, typename J::parse_event_t event, J& parsed) {
    switch (event) {
      case J::parse_event_t::object_start:
      case J::parse_event_t::array_start:
        if (++nesting > kMaxJsonNesting) {
          throw ValueError(
              fmt::format("{}: {} nests deeper than {} levels", where, what, kMaxJsonNesting));
        }
        if (event == J::parse_event_t::object_start) {
          objects.push_back({{}, objects.empty() ? std::string() : last_key});
        }
        break;
      case J::parse_event_t::object_end:
        objects.pop_back();
        --nesting;
        break;
      case J::parse_event_t::array_end:
        --nesting;
        break;
      case J::parse_event_t::key: {
        last_key = parsed.template get<std::string>();
        Frame& frame = objects.back();
        if (!frame.keys.insert(last_key).second) {
          if (objects.size() == 1) {
            throw ValueError(fmt::format("{}: {} has key '{}' twice", where, what, last_key));
          }
          throw ValueError(fmt::format("{}: {} has key '{}' twice in the object of '{}'", where,
                                       what, last_key, frame.owner));
        }
        break;
      }
      case J::parse_event_t::value:
        break;
    }
    return true;
  };

  try {
    return J::parse(text.begin(), text.end(), check_keys);
  } catch (const typename J::exception& e) {
    // A parse_error, or an out_of_range for a number beyond double ("1e999": found by
    // safetensors_index_fuzz, where it escaped as nlohmann's own exception). nlohmann's text starts
    // with "[json.exception.parse_error.101] ", which says nothing to a reader of the message.
    std::string_view message = e.what();
    if (const auto close = message.find("] ");
        message.starts_with("[json.") && close != std::string_view::npos) {
      message.remove_prefix(close + 2);
    }
    throw ValueError(fmt::format("{}: {} is not valid JSON: {}", where, what, message));
  }
}

}  // namespace

Json parse_strict_json(std::string_view text, std::string_view where, std::string_view what) {
  return parse_strict<Json>(text, where, what);
}

nlohmann::json parse_strict_json_map(std::string_view text, std::string_view where,
                                     std::string_view what) {
  return parse_strict<nlohmann::json>(text, where, what);
}

std::string json_excerpt(const Json& value) {
  constexpr std::size_t kMaxShown = 80;
  std::string text = value.dump();
  if (text.size() > kMaxShown) {
    std::size_t cut = kMaxShown;
    // Never cut a UTF-8 sequence in two: back up to the start of the character.
    while (cut > 0 && (static_cast<std::uint8_t>(text[cut]) & 0xC0U) == 0x80U) --cut;
    text.resize(cut);
    text += "...";
  }
  return text;
}

}  // namespace numesh::models::detail
