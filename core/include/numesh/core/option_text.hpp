#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

// How an error names an option of its caller. The library checks options once for every front
// end, and each names them its own way: the command line as flags (`--kv-cache-tokens 0`),
// Python as keyword arguments (`kv_cache_tokens=0`).

namespace numesh {

/// The front end whose options an error names.
enum class OptionStyle : std::uint8_t {
  kFlag,     ///< the command line: --kv-cache-tokens 0
  kKeyword,  ///< Python: kv_cache_tokens=0
};

/// `option` (spelled as an identifier: kv_cache_tokens) as `style` names it: "--kv-cache-tokens"
/// or "kv_cache_tokens".
inline std::string option_name(OptionStyle style, std::string_view option) {
  std::string name(option);
  if (style == OptionStyle::kKeyword) return name;
  std::replace(name.begin(), name.end(), '_', '-');
  return "--" + name;
}

/// `option` with its value as `style` names them: "--kv-cache-tokens 0" or "kv_cache_tokens=0".
template <typename Value>
std::string option_text(OptionStyle style, std::string_view option, const Value& value) {
  const std::string name = option_name(style, option);
  return style == OptionStyle::kFlag ? fmt::format("{} {}", name, value)
                                     : fmt::format("{}={}", name, value);
}

}  // namespace numesh
