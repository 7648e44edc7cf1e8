#pragma once

// PRIVATE to models/src: GPT-2's byte-level scheme, as Hugging Face tokenizers' ByteLevel
// pre-tokenizer and decoder apply it. Every byte gets a printable code point (the printable
// Latin-1 bytes keep their own, the other 68 get U+0100.. in byte order), so that BPE works on
// strings of visible characters and a space becomes "Ġ" (U+0120).

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace numesh::models::detail {

/// byte_to_unicode()[b]: the UTF-8 of the code point GPT-2's table gives byte b.
[[nodiscard]] const std::array<std::string, 256>& byte_to_unicode();

/// Appends the byte-level form of `bytes` (any bytes) to `out`.
void append_byte_level(std::string_view bytes, std::string& out);

/// Appends the bytes of `token` (valid UTF-8) read backwards through the table to `out` and
/// returns true, or returns false and appends nothing when a character of `token` is not in the
/// table (an added token such as "<think>" is; one with CJK text is not, and Hugging Face's
/// ByteLevel decoder then keeps the token's own bytes).
bool append_byte_level_decoded(std::string_view token, std::string& out);

/// `bytes` as valid UTF-8: each maximal ill-formed subpart becomes U+FFFD, as Rust's
/// String::from_utf8_lossy (and the WHATWG decoder) do.
[[nodiscard]] std::string utf8_lossy(std::string_view bytes);

/// Decodes the code point at `text[i]` (valid UTF-8) and advances `i` past it.
[[nodiscard]] char32_t next_code_point(std::string_view text, std::size_t& i) noexcept;

}  // namespace numesh::models::detail
