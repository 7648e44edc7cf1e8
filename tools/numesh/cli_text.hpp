#pragma once

// Text helpers shared by the subcommands' option parsing.

#include <string>
#include <string_view>
#include <vector>

#include "numesh/sharding/mesh.hpp"

namespace numesh::tools {

/// `s` without leading and trailing spaces and tabs.
std::string_view trim(std::string_view s);

/// Splits a comma-separated list at the commas outside brackets, trimming each item
/// ("a, (b,c)" -> {"a", "(b,c)"}); empty items are kept ("a,,b" -> {"a", "", "b"}).
/// REQUIRES: brackets already checked balanced where the caller allows them.
std::vector<std::string_view> split_list(std::string_view text);

/// "dp=2, ep=1, tp=4": a mesh's axes and sizes, as the run and op reports print them.
std::string axes_text(const sharding::Mesh& mesh);

}  // namespace numesh::tools
