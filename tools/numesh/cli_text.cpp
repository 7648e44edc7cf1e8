#include "cli_text.hpp"

#include <fmt/format.h>

namespace numesh::tools {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split_list(std::string_view text) {
  std::vector<std::string_view> out;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '(' || c == '[') ++depth;
    if (c == ')' || c == ']') --depth;
    if (c == ',' && depth == 0) {
      out.push_back(trim(text.substr(start, i - start)));
      start = i + 1;
    }
  }
  out.push_back(trim(text.substr(start)));
  return out;
}

std::string axes_text(const sharding::Mesh& mesh) {
  std::string out;
  for (std::size_t a = 0; a < mesh.rank(); ++a) {
    out += fmt::format("{}{}={}", a == 0 ? "" : ", ", mesh.names()[a], mesh.sizes()[a]);
  }
  return out;
}

}  // namespace numesh::tools
