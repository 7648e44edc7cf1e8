#include "chat/python_str.hpp"

#include <fmt/format.h>
#include <utf8proc.h>

#include <stdexcept>

#include "utf8.hpp"

namespace numesh::models::chat {

std::vector<char32_t> code_points(const std::string& text) {
  std::vector<char32_t> points;
  points.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<std::uint8_t>(text[i]);
    const detail::Utf8Lead rule = detail::utf8_lead(lead);
    bool ok = rule.starts;
    for (std::size_t k = 1; ok && k <= rule.needed; ++k) {
      ok = i + k < text.size() &&
           detail::utf8_continues(rule, k, static_cast<std::uint8_t>(text[i + k]));
    }
    if (!ok) {
      // An ill-formed byte kept as Python's surrogateescape keeps it, so it comes back out.
      points.push_back(0xDC00 + lead);
      ++i;
      continue;
    }
    char32_t c = rule.needed == 0 ? lead : lead & (0x3F >> rule.needed);
    for (std::size_t k = 1; k <= rule.needed; ++k) {
      c = (c << 6) | (static_cast<std::uint8_t>(text[i + k]) & 0x3F);
    }
    points.push_back(c);
    i += rule.needed + 1;
  }
  return points;
}

std::string from_code_points(const std::vector<char32_t>& points) {
  std::string out;
  out.reserve(points.size());
  for (char32_t c : points) {
    if (c >= 0xDC80 && c <= 0xDCFF) {
      out += static_cast<char>(c - 0xDC00);  // an escaped ill-formed byte, back as it was
    } else {
      detail::append_utf8(c, out);
    }
  }
  return out;
}

bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

namespace {

// Python's str.isprintable() for one code point: not a control, format, surrogate, private-use,
// unassigned or separator character, the ASCII space excepted.
bool printable(char32_t c) {
  if (c == ' ') return true;
  if (c >= 0xDC80 && c <= 0xDCFF) return false;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

}  // namespace

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : code_points(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (printable(c)) {
      out += from_code_points({c});
    } else if (c < 0x100 || (c >= 0xDC80 && c <= 0xDCFF)) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(c < 0x100 ? c : c - 0xDC00));
    } else if (c < 0x10000) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    } else {
      out += fmt::format("\\U{:08x}", static_cast<unsigned>(c));
    }
  }
  out += quote;
  return out;
}

std::string strip(const std::string& text, bool left, bool right, const std::string* chars) {
  const std::vector<char32_t> points = code_points(text);
  const std::vector<char32_t> set = chars ? code_points(*chars) : std::vector<char32_t>{};
  const auto strippable = [&](char32_t c) {
    if (chars == nullptr) return is_space(c);
    for (char32_t s : set) {
      if (s == c) return true;
    }
    return false;
  };
  std::size_t begin = 0;
  std::size_t end = points.size();
  while (left && begin < end && strippable(points[begin])) ++begin;
  while (right && end > begin && strippable(points[end - 1])) --end;
  return from_code_points({points.begin() + static_cast<std::ptrdiff_t>(begin),
                           points.begin() + static_cast<std::ptrdiff_t>(end)});
}

std::vector<std::string> split(const std::string& text, const std::string* separator,
                               long max_split) {
  std::vector<std::string> parts;
  if (separator != nullptr) {
    if (separator->empty()) throw std::invalid_argument("empty separator");
    std::size_t start = 0;
    while (max_split < 0 || static_cast<long>(parts.size()) < max_split) {
      const std::size_t at = text.find(*separator, start);
      if (at == std::string::npos) break;
      parts.push_back(text.substr(start, at - start));
      start = at + separator->size();
    }
    parts.push_back(text.substr(start));
    return parts;
  }
  // On whitespace: runs are one separator, and there are no empty parts.
  const std::vector<char32_t> points = code_points(text);
  std::size_t i = 0;
  while (i < points.size()) {
    while (i < points.size() && is_space(points[i])) ++i;
    if (i == points.size()) break;
    if (max_split >= 0 && static_cast<long>(parts.size()) == max_split) {
      // The rest, less its trailing whitespace, is the last part.
      std::size_t end = points.size();
      while (end > i && is_space(points[end - 1])) --end;
      parts.push_back(from_code_points({points.begin() + static_cast<std::ptrdiff_t>(i),
                                        points.begin() + static_cast<std::ptrdiff_t>(end)}));
      break;
    }
    std::size_t j = i;
    while (j < points.size() && !is_space(points[j])) ++j;
    parts.push_back(from_code_points({points.begin() + static_cast<std::ptrdiff_t>(i),
                                      points.begin() + static_cast<std::ptrdiff_t>(j)}));
    i = j;
  }
  return parts;
}

namespace {

// Unicode's SpecialCasing.txt, the unconditional entries Python applies that the simple
// mappings miss: (character, upper, title).
struct SpecialCase {
  char32_t c;
  std::u32string upper;
  std::u32string title;
};

const std::vector<SpecialCase>& special_cases() {
  static const std::vector<SpecialCase> table = {
      {0x00DF, U"SS", U"Ss"},
      {0x0149, U"\u02BCN", U"\u02BCN"},
      {0x01F0, U"J\u030C", U"J\u030C"},
      {0x0390, U"\u0399\u0308\u0301", U"\u0399\u0308\u0301"},
      {0x03B0, U"\u03A5\u0308\u0301", U"\u03A5\u0308\u0301"},
      {0x0587, U"\u0535\u0552", U"\u0535\u0582"},
      {0x1E96, U"H\u0331", U"H\u0331"},
      {0x1E97, U"T\u0308", U"T\u0308"},
      {0x1E98, U"W\u030A", U"W\u030A"},
      {0x1E99, U"Y\u030A", U"Y\u030A"},
      {0x1E9A, U"A\u02BE", U"A\u02BE"},
      {0xFB00, U"FF", U"Ff"},
      {0xFB01, U"FI", U"Fi"},
      {0xFB02, U"FL", U"Fl"},
      {0xFB03, U"FFI", U"Ffi"},
      {0xFB04, U"FFL", U"Ffl"},
      {0xFB05, U"ST", U"St"},
      {0xFB06, U"ST", U"St"},
      {0xFB13, U"\u0544\u0546", U"\u0544\u0576"},
      {0xFB14, U"\u0544\u0535", U"\u0544\u0565"},
      {0xFB15, U"\u0544\u053B", U"\u0544\u056B"},
      {0xFB16, U"\u054E\u0546", U"\u054E\u0576"},
      {0xFB17, U"\u0544\u053D", U"\u0544\u056D"},
  };
  return table;
}

const SpecialCase* special_case(char32_t c) {
  for (const SpecialCase& s : special_cases()) {
    if (s.c == c) return &s;
  }
  return nullptr;
}

bool escaped_byte(char32_t c) { return c >= 0xDC80 && c <= 0xDCFF; }

utf8proc_category_t category(char32_t c) {
  return escaped_byte(c) ? UTF8PROC_CATEGORY_CN
                         : utf8proc_category(static_cast<utf8proc_int32_t>(c));
}

bool cased(char32_t c) {
  const auto k = category(c);
  return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

}  // namespace

std::string upper(const std::string& text) {
  std::vector<char32_t> out;
  for (char32_t c : code_points(text)) {
    if (const SpecialCase* s = special_case(c)) {
      out.insert(out.end(), s->upper.begin(), s->upper.end());
    } else {
      out.push_back(escaped_byte(c) ? c
                                    : static_cast<char32_t>(
                                          utf8proc_toupper(static_cast<utf8proc_int32_t>(c))));
    }
  }
  return from_code_points(out);
}

std::string lower(const std::string& text) {
  const std::vector<char32_t> points = code_points(text);
  std::vector<char32_t> out;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const char32_t c = points[i];
    if (c == 0x0130) {  // 'İ' -> 'i' + combining dot above
      out.push_back('i');
      out.push_back(0x0307);
    } else if (c == 0x03A3) {
      // Final sigma: after a cased letter, and not before one.
      const bool after = i > 0 && cased(points[i - 1]);
      const bool before = i + 1 < points.size() && cased(points[i + 1]);
      out.push_back(after && !before ? 0x03C2 : 0x03C3);
    } else {
      out.push_back(escaped_byte(c) ? c
                                    : static_cast<char32_t>(
                                          utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
    }
  }
  return from_code_points(out);
}

std::string title_char(char32_t c) {
  if (const SpecialCase* s = special_case(c)) {
    return from_code_points(std::vector<char32_t>(s->title.begin(), s->title.end()));
  }
  if (escaped_byte(c)) return from_code_points({c});
  return from_code_points(
      {static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c)))});
}

bool is_cased(char32_t c) { return cased(c); }

bool is_lower(const std::string& text) {
  bool any = false;
  for (char32_t c : code_points(text)) {
    const auto k = category(c);
    if (k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT) return false;
    any = any || k == UTF8PROC_CATEGORY_LL;
  }
  return any;
}

bool is_upper(const std::string& text) {
  bool any = false;
  for (char32_t c : code_points(text)) {
    const auto k = category(c);
    if (k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT) return false;
    any = any || k == UTF8PROC_CATEGORY_LU;
  }
  return any;
}

bool is_word(char32_t c) {
  if (c == '_') return true;
  switch (category(c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

}  // namespace numesh::models::chat
