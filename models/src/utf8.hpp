#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

// UTF-8's well-formed byte sequences (Unicode's Table 3-7) and its encoder: the one definition
// the strict JSON check, the tokenizer's byte-level tables and the chat templates' strings share.

namespace numesh::models::detail {

/// What a byte in lead position allows: how many continuation bytes follow it, and the range
/// of the first of them (the rest are 0x80-0xBF). That range is what excludes overlong forms
/// (E0, F0), UTF-16 surrogates (ED) and code points above U+10FFFF (F4). `starts` is false for
/// bytes that never start a sequence (continuation bytes, C0, C1, F5-FF); ASCII needs 0 more.
struct Utf8Lead {
  bool starts = false;
  std::size_t needed = 0;
  std::uint8_t low = 0x80;
  std::uint8_t high = 0xBF;
};

/// The rule of lead byte `lead`.
constexpr Utf8Lead utf8_lead(std::uint8_t lead) noexcept {
  if (lead < 0x80) return {true, 0, 0x80, 0xBF};
  if (lead >= 0xC2 && lead <= 0xDF) return {true, 1, 0x80, 0xBF};
  if (lead >= 0xE0 && lead <= 0xEF) {
    return {true, 2, static_cast<std::uint8_t>(lead == 0xE0 ? 0xA0 : 0x80),
            static_cast<std::uint8_t>(lead == 0xED ? 0x9F : 0xBF)};
  }
  if (lead >= 0xF0 && lead <= 0xF4) {
    return {true, 3, static_cast<std::uint8_t>(lead == 0xF0 ? 0x90 : 0x80),
            static_cast<std::uint8_t>(lead == 0xF4 ? 0x8F : 0xBF)};
  }
  return {};
}

/// Whether `next` may be continuation byte number k (1-based) after a lead of rule `rule`.
constexpr bool utf8_continues(const Utf8Lead& rule, std::size_t k, std::uint8_t next) noexcept {
  return next >= (k == 1 ? rule.low : 0x80) && next <= (k == 1 ? rule.high : 0xBF);
}

/// Appends code point `cp` (at most U+10FFFF) to `out` as UTF-8.
inline void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace numesh::models::detail
