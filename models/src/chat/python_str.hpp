#pragma once

#include <string>
#include <vector>

// Python's str operations that chat templates call, on UTF-8 text: code points (what len(),
// indexing and slicing count), whitespace as str.isspace() knows it, strip and split, repr().

namespace numesh::models::chat {

/// Unicode code points of UTF-8 text; an ill-formed byte b becomes U+DC00+b (Python's
/// surrogateescape), which from_code_points() turns back into the byte.
std::vector<char32_t> code_points(const std::string& text);
/// UTF-8 of code points.
std::string from_code_points(const std::vector<char32_t>& points);
/// Python's str.isspace() for one code point.
bool is_space(char32_t c);
/// Python's str.strip / lstrip / rstrip: `chars` null strips whitespace, else those characters.
std::string strip(const std::string& text, bool left, bool right, const std::string* chars);
/// Python's str.split(): on runs of whitespace (`separator` null) or on `separator`, at most
/// `max_split` times (< 0: no limit). Throws std::invalid_argument for an empty separator.
std::vector<std::string> split(const std::string& text, const std::string* separator,
                               long max_split);
/// Python's str.upper() / str.lower(): Unicode's case mappings with the unconditional special
/// ones ('ß' -> 'SS', the Latin and Armenian ligatures, 'İ' -> 'i̇') and the final sigma.
std::string upper(const std::string& text);
std::string lower(const std::string& text);
/// The titlecase of one character as Python's str.title() and capitalize() map it ('ß' -> 'Ss').
std::string title_char(char32_t c);
/// Whether `c` is a cased letter (upper, lower or titlecase).
bool is_cased(char32_t c);
/// Python's str.islower() / isupper(): at least one cased character, and all of that case.
bool is_lower(const std::string& text);
bool is_upper(const std::string& text);
/// A character of the regular expression \w (Python's str pattern): a letter, a number, '_'.
bool is_word(char32_t c);
/// Python's repr() of a str: quotes chosen as Python does, escapes for the unprintable.
std::string string_repr(const std::string& text);

}  // namespace numesh::models::chat
