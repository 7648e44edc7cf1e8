// Evaluator for helpers.json: eformer.escale.helpers rule classes and ShardingAnalyzer
// (SPEC 11).

#include <memory>
#include <optional>
#include <regex>

#include "conformance.hpp"
#include "numesh/sharding/sharding_rules.hpp"
#include "tree_codec.hpp"

namespace numesh::conformance {
namespace {

using sharding::NamedLeaf;
using sharding::PartitionSpec;

std::optional<std::vector<std::string>> optional_names(const json& j) {
  if (j.is_null()) return std::nullopt;
  return j.get<std::vector<std::string>>();
}

// A mesh written as in the vector ids: "dp2_tp4" is {dp: 2, tp: 4}.
sharding::Mesh mesh_from_label(const std::string& label) {
  static const std::regex part(R"(([A-Za-z]+)(\d+))");
  std::vector<std::string> names;
  std::vector<std::int64_t> sizes;
  for (std::sregex_iterator it(label.begin(), label.end(), part), end; it != end; ++it) {
    names.push_back((*it)[1]);
    sizes.push_back(std::stoll((*it)[2]));
  }
  if (names.empty()) throw NotEvaluated("cannot read mesh label " + label);
  return sharding::Mesh(names, sizes);
}

// The Composite case names its sub-rules by short descriptions; these are the two forms used:
//   "ShapeBased{(None,):P('dp')}"            one pattern (entries None or ints) -> spec
//   "MemoryConstrained(1<<20, dp2_tp4)"      max bytes (an int or a<<b), mesh label
std::shared_ptr<const sharding::ShardingRule> rule_from_description(const std::string& text) {
  static const std::regex shape_based(R"(ShapeBased\{\(([^)]*)\):(P\(.*\))\})");
  static const std::regex memory(R"(MemoryConstrained\((\d+)(?:<<(\d+))?, (\w+)\))");
  std::smatch m;
  if (std::regex_match(text, m, shape_based)) {
    sharding::ShapePattern pattern;
    static const std::regex item(R"(\s*(None|\d+)\s*)");
    const std::string body = m[1];
    std::size_t start = 0;
    while (start < body.size()) {
      const std::size_t comma = body.find(',', start);
      const std::string piece =
          body.substr(start, comma == std::string::npos ? comma : comma - start);
      std::smatch im;
      if (!std::regex_match(piece, im, item)) throw NotEvaluated("cannot read pattern " + body);
      pattern.push_back(im[1] == "None" ? std::nullopt
                                        : std::optional<std::int64_t>(std::stoll(im[1])));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    std::vector<std::pair<sharding::ShapePattern, PartitionSpec>> patterns{
        {pattern, PartitionSpec::parse(m[2].str())}};
    return std::make_shared<sharding::ShapeBasedShardingRule>(std::move(patterns));
  }
  if (std::regex_match(text, m, memory)) {
    std::int64_t bytes = std::stoll(m[1]);
    if (m[2].matched) bytes <<= std::stoll(m[2]);
    return std::make_shared<sharding::MemoryConstrainedShardingRule>(bytes, mesh_from_label(m[3]));
  }
  throw NotEvaluated("unknown rule description " + text);
}

json specs_tree(const json& tree, const std::vector<PartitionSpec>& specs) {
  std::vector<json> leaves;
  for (const auto& s : specs) leaves.push_back(spec_leaf(s));
  return rebuild_tree(tree, leaves);
}

json eval_helpers(const json& /*file*/, const json& c) {
  const std::string id = c.at("id");
  const json& in = c.at("inputs");
  const std::string kind = id.substr(0, id.find('/'));
  const json& tree = in.at("tree");
  const auto flat = flatten_tree(tree);
  const auto leaves = named_leaves(flat);

  json result = capture([&]() -> json {
    if (kind == "MemoryConstrainedShardingRule") {
      sharding::MemoryConstrainedShardingRule rule(
          in.at("max_memory_per_device").get<std::int64_t>(), decode_mesh(in.at("mesh")),
          optional_names(in.at("axis_names")));
      return json{{"tree", specs_tree(tree, rule.apply(leaves))}};
    }
    if (kind == "ShapeBasedShardingRule") {
      std::vector<std::pair<sharding::ShapePattern, PartitionSpec>> patterns;
      for (const json& p : in.at("patterns")) {
        sharding::ShapePattern pattern;
        for (const json& e : p.at(0)) {
          pattern.push_back(e.is_null() ? std::nullopt
                                        : std::optional<std::int64_t>(e.get<std::int64_t>()));
        }
        patterns.emplace_back(std::move(pattern), decode_spec(p.at(1)));
      }
      sharding::ShapeBasedShardingRule rule(std::move(patterns));
      return json{{"tree", specs_tree(tree, rule.apply(leaves))}};
    }
    if (kind == "CompositeShardingRule") {
      std::vector<std::shared_ptr<const sharding::ShardingRule>> rules;
      for (const json& r : in.at("rules"))
        rules.push_back(rule_from_description(r.get<std::string>()));
      sharding::CompositeShardingRule rule(std::move(rules));
      return json{{"tree", specs_tree(tree, rule.apply(leaves))}};
    }
    if (kind == "AutoShardingRule") {
      std::optional<std::int64_t> min_size;
      if (!in.at("min_shard_size").is_null()) min_size = in["min_shard_size"].get<std::int64_t>();
      sharding::AutoShardingRule rule(decode_mesh(in.at("mesh")),
                                      optional_names(in.at("axis_names")), min_size);
      return json{{"tree", specs_tree(tree, rule.apply(leaves))}};
    }
    std::vector<PartitionSpec> specs;
    // The specs tree has the array tree's structure (eformer's `partition_specs` argument).
    const char* specs_key = in.contains("specs") ? "specs" : "partition_specs";
    if (in.contains(specs_key)) {
      for (const auto& leaf : flat) specs.push_back(decode_spec(at_key_path(in[specs_key], leaf)));
    }
    sharding::ShardingAnalyzer analyzer(decode_mesh(in.at("mesh")));
    if (kind == "ShardingAnalyzer.validate_partition_specs") {
      return json{{"issues", analyzer.validate_partition_specs(leaves, specs)}};
    }
    if (kind == "ShardingAnalyzer.estimate_memory_usage") {
      const auto usage = analyzer.estimate_memory_usage(leaves, specs);
      return json{{"total_size", usage.total_size}, {"size_per_device", usage.size_per_device}};
    }
    throw NotEvaluated("unknown helper " + kind);
  });
  return result.contains("error") ? json{{"error", result["error"]}} : result["ok"];
}

}  // namespace

NUMESH_CONFORMANCE_EVALUATOR("helpers.json", eval_helpers);

}  // namespace numesh::conformance
