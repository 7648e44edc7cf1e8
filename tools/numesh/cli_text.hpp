#pragma once

// Text helpers shared by the subcommands' option parsing.

#include <string_view>
#include <vector>

namespace numesh::tools {

/// `s` without leading and trailing spaces and tabs.
std::string_view trim(std::string_view s);

/// Splits a comma-separated list at the commas outside brackets, trimming each item
/// ("a, (b,c)" -> {"a", "(b,c)"}); empty items are kept ("a,,b" -> {"a", "", "b"}).
/// REQUIRES: brackets already checked balanced where the caller allows them.
std::vector<std::string_view> split_list(std::string_view text);

}  // namespace numesh::tools
