// Evaluator for match_partition_rules.json: eformer's match_partition_rules over named trees
// (SPEC 7).

#include <optional>
#include <vector>

#include "conformance.hpp"
#include "numesh/sharding/rule_matching.hpp"
#include "tree_codec.hpp"

namespace numesh::conformance {
namespace {

// `{"$python": v}` is a Python leaf without a shape; tree_codec reads objects as dicts, so
// turn it into a plain scalar leaf.
json unwrap_python_leaves(const json& tree) {
  if (tree.is_object()) {
    if (tree.contains("$python")) {
      const json& v = tree["$python"];
      return v.is_primitive() && !v.is_null() ? v : json("<python object>");
    }
    if (tree.contains("$array") || tree.contains("$spec")) return tree;
    json out = json::object();
    for (const auto& [k, v] : tree.items()) out[k] = unwrap_python_leaves(v);
    return out;
  }
  if (tree.is_array()) {
    json out = json::array();
    for (const auto& v : tree) out.push_back(unwrap_python_leaves(v));
    return out;
  }
  return tree;
}

json eval_match_partition_rules(const json& /*file*/, const json& c) {
  const json& in = c.at("inputs");
  std::vector<sharding::PartitionRule> rules;
  for (const json& r : in.at("rules"))
    rules.push_back({r.at(0).get<std::string>(), decode_spec(r.at(1))});
  std::optional<std::int64_t> min_size = 0;
  if (in.contains("min_size")) {
    min_size = in["min_size"].is_null()
                   ? std::nullopt
                   : std::optional<std::int64_t>(in["min_size"].get<std::int64_t>());
  }
  const bool strict = in.value("strict", true);
  const json tree = unwrap_python_leaves(in.at("tree"));

  const json r = capture([&] {
    std::vector<sharding::NamedLeaf> leaves;
    for (const FlatLeaf& f : flatten_tree(tree)) leaves.push_back(to_named_leaf(f));
    const auto specs = sharding::match_partition_rules(rules, leaves, min_size, strict);
    std::vector<json> encoded;
    for (const auto& s : specs) encoded.push_back(spec_leaf(s));
    return json{{"tree", rebuild_tree(tree, encoded)}};
  });
  return r.contains("error") ? json{{"error", r["error"]}} : r["ok"];
}

}  // namespace

NUMESH_CONFORMANCE_EVALUATOR("match_partition_rules.json", eval_match_partition_rules);

}  // namespace numesh::conformance
