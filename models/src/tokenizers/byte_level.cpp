#include "byte_level.hpp"

#include <optional>

#include "../utf8.hpp"

namespace numesh::models::detail {
namespace {

// GPT-2's bytes_to_unicode(): the bytes '!'..'~', '¡'..'¬' and '®'..'ÿ' map to themselves; the
// others, in increasing order, to U+0100, U+0101, ... (so every code point is below U+0144).
struct Tables {
  std::array<std::string, 256> to_unicode;
  std::array<std::int16_t, 0x144> to_byte{};  // -1: not in the table
  Tables() {
    to_byte.fill(-1);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t cp = printable ? static_cast<char32_t>(b) : next++;
      append_utf8(cp, to_unicode[static_cast<std::size_t>(b)]);
      to_byte[cp] = static_cast<std::int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

const std::array<std::string, 256>& byte_to_unicode() { return tables().to_unicode; }

void append_byte_level(std::string_view bytes, std::string& out) {
  const auto& to_unicode = tables().to_unicode;
  for (const char c : bytes) out += to_unicode[static_cast<std::uint8_t>(c)];
}

char32_t next_code_point(std::string_view text, std::size_t& i) noexcept {
  const auto lead = static_cast<std::uint8_t>(text[i]);
  std::size_t n = 0;
  char32_t cp = 0;
  if (lead < 0x80) {
    n = 1;
    cp = lead;
  } else if (lead < 0xE0) {
    n = 2;
    cp = lead & 0x1FU;
  } else if (lead < 0xF0) {
    n = 3;
    cp = lead & 0x0FU;
  } else {
    n = 4;
    cp = lead & 0x07U;
  }
  for (std::size_t k = 1; k < n && i + k < text.size(); ++k) {
    cp = (cp << 6) | (static_cast<std::uint8_t>(text[i + k]) & 0x3FU);
  }
  i += n;
  return cp;
}

bool append_byte_level_decoded(std::string_view token, std::string& out) {
  const auto& to_byte = tables().to_byte;
  const std::size_t start = out.size();
  for (std::size_t i = 0; i < token.size();) {
    const char32_t cp = next_code_point(token, i);
    if (cp >= to_byte.size() || to_byte[cp] < 0) {
      out.resize(start);
      return false;
    }
    out += static_cast<char>(to_byte[cp]);
  }
  return true;
}

std::string utf8_lossy(std::string_view bytes) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(bytes.size());
  std::size_t i = 0;
  while (i < bytes.size()) {
    const auto lead = static_cast<std::uint8_t>(bytes[i]);
    if (lead < 0x80) {
      out += static_cast<char>(lead);
      ++i;
      continue;
    }
    const Utf8Lead rule = utf8_lead(lead);
    if (!rule.starts) {
      out += kReplacement;  // a byte that never starts a character is a subpart by itself
      ++i;
      continue;
    }
    const std::size_t needed = rule.needed;
    // The maximal subpart: the lead and the continuation bytes that still fit; one U+FFFD
    // replaces all of it when the character is not complete.
    std::size_t k = 1;
    while (k <= needed && i + k < bytes.size()) {
      if (!utf8_continues(rule, k, static_cast<std::uint8_t>(bytes[i + k]))) break;
      ++k;
    }
    if (k == needed + 1) {
      out.append(bytes.substr(i, k));
    } else {
      out += kReplacement;
    }
    i += k;
  }
  return out;
}

}  // namespace numesh::models::detail
