#include "paxis_options.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>

#include "numesh/core/error.hpp"
#include "parsers.hpp"

namespace numesh::tools {

using json = nlohmann::json;

sharding::PartitionAxis build_paxis(const std::string& paxis_json,
                                    const std::vector<std::string>& sets) {
  json fields = json::object();
  if (!paxis_json.empty()) {
    std::ifstream in(paxis_json);
    if (!in) throw ValueError(fmt::format("cannot read --paxis-json file '{}'", paxis_json));
    try {
      fields = json::parse(in);
    } catch (const json::exception& e) {
      throw ValueError(
          fmt::format("--paxis-json file '{}' is not valid JSON: {}", paxis_json, e.what()));
    }
    if (!fields.is_object()) {
      throw ValueError(
          fmt::format("--paxis-json file '{}' must hold a JSON object of fields", paxis_json));
    }
  }
  // --set values are merged into the fields before construction, so that dependent fields
  // are derived from them (unlike PartitionAxis::replace, which keeps derived values).
  for (const std::string& s : sets) {
    auto [field, value] = parse_field_set(s);
    fields[field] = std::move(value);
  }
  return sharding::PartitionAxis::from_json(fields);
}

std::string model_axes_text(const ops::ModelAxes& axes) {
  const auto or_dash = [](const std::string& a) { return a.empty() ? std::string("-") : a; };
  return fmt::format("batch ({}), sequence {}, heads {}, mlp {}, experts {}, expert ffn {}",
                     fmt::join(axes.batch, ", "), or_dash(axes.sequence), or_dash(axes.heads),
                     or_dash(axes.mlp), or_dash(axes.expert), or_dash(axes.expert_tensor));
}

}  // namespace numesh::tools
