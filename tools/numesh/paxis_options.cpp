#include "paxis_options.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "numesh/core/error.hpp"
#include "cli_text.hpp"

namespace numesh::tools {

using json = nlohmann::json;

bool is_none_word(std::string_view s) { return s.empty() || s == "None" || s == "none" || s == "null"; }

namespace {

// A --set value: None/null -> null, (a,b) or [a,b] -> array, anything else -> string.
json parse_set_value(std::string_view v) {
  v = trim(v);
  if (is_none_word(v)) return nullptr;
  if (v.front() == '(' || v.front() == '[') {
    const char close = v.front() == '(' ? ')' : ']';
    if (v.back() != close) {
      throw ValueError(fmt::format("--set value '{}' has an unclosed bracket", v));
    }
    json arr = json::array();
    const std::string_view inner = trim(v.substr(1, v.size() - 2));
    if (inner.empty()) return arr;
    for (std::string_view m : split_list(inner)) {
      if (m.find_first_of("()[]") != std::string_view::npos) {
        throw ValueError(fmt::format("--set value '{}' nests brackets", v));
      }
      arr.push_back(is_none_word(m) ? json(nullptr) : json(std::string(m)));
    }
    return arr;
  }
  return std::string(v);
}

}  // namespace

sharding::PartitionAxis build_paxis(const std::string& paxis_json, const std::vector<std::string>& sets) {
  json fields = json::object();
  if (!paxis_json.empty()) {
    std::ifstream in(paxis_json);
    if (!in) throw ValueError(fmt::format("cannot read --paxis-json file '{}'", paxis_json));
    try {
      fields = json::parse(in);
    } catch (const json::exception& e) {
      throw ValueError(fmt::format("--paxis-json file '{}' is not valid JSON: {}", paxis_json,
                                   e.what()));
    }
    if (!fields.is_object()) {
      throw ValueError(fmt::format("--paxis-json file '{}' must hold a JSON object of fields",
                                   paxis_json));
    }
  }
  // --set values are merged into the fields before construction, so that dependent fields
  // are derived from them (unlike PartitionAxis::replace, which keeps derived values).
  for (const std::string& s : sets) {
    const auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw ValueError(fmt::format("--set '{}' is not of the form field=value", s));
    }
    fields[std::string(trim(std::string_view(s).substr(0, eq)))] =
        parse_set_value(std::string_view(s).substr(eq + 1));
  }
  return sharding::PartitionAxis::from_json(fields);
}

}  // namespace numesh::tools
