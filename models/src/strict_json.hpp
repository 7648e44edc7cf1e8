#pragma once

// PRIVATE to models/src: JSON as checkpoint files must be, for the safetensors header and the
// sharded checkpoint's index. nlohmann's parser accepts a key twice in one object (the last
// value silently wins) and reports bad UTF-8 only as a generic syntax error; a checkpoint whose
// header names a tensor twice is ambiguous (the safetensors format forbids duplicate keys), so
// both are refused here with a message that says what and where.

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace numesh::models::detail {

/// Objects keep the file's key order, so errors come in the order a reader of the file sees.
using Json = nlohmann::ordered_json;

/// Deeper nesting than any header or index has (they nest 3 deep); bounds the work hostile
/// input can cause.
inline constexpr int kMaxJsonNesting = 32;

/// The offset of the first byte of `text` that cannot continue well-formed UTF-8 (RFC 3629: no
/// overlong forms, no surrogates, nothing above U+10FFFF), text.size() when it ends inside a
/// character, or nullopt when all of it is well-formed.
[[nodiscard]] std::optional<std::size_t> find_invalid_utf8(std::string_view text) noexcept;

/// Parses `text`, which `what` names in messages ("the header", "the index").
/// Throws: ValueError "<where>: <what> is not valid UTF-8 (byte 0x.. at offset N)", "... is
/// not valid JSON: <the parser's message>", "... has key 'k' twice" (at the top level) or
/// "... has key 'k' twice in the object of 'owner'", or "... nests deeper than 32 levels".
[[nodiscard]] Json parse_strict_json(std::string_view text, std::string_view where,
                                     std::string_view what);

/// parse_strict_json with the same rules and messages, into nlohmann::json, whose objects are
/// std::maps (keys sorted): for documents with very large objects, such as a tokenizer.json's
/// vocabulary of 150,000 entries, where ordered_json's linear key lookup on insertion would
/// make parsing quadratic.
/// Throws: ValueError as parse_strict_json.
[[nodiscard]] nlohmann::json parse_strict_json_map(std::string_view text, std::string_view where,
                                                   std::string_view what);

/// `value` as compact JSON for a message, cut to about 80 characters.
[[nodiscard]] std::string json_excerpt(const Json& value);

}  // namespace numesh::models::detail
