// Evaluator for sharding_strategy.json: optimize_sharding_for_memory, validate_sharding_config,
// analyze_sharding_strategy and convert_sharding_strategy (SPEC 8.2-8.5).

#include <optional>

#include "conformance.hpp"
#include "numesh/sharding/sharding_strategy.hpp"
#include "tree_codec.hpp"

namespace numesh::conformance {
namespace {

// The specs tree has the array tree's structure, with raw spec lists as leaves.
std::vector<sharding::PartitionSpec> specs_along(const json& specs,
                                                 const std::vector<FlatLeaf>& flat) {
  std::vector<sharding::PartitionSpec> out;
  for (const auto& leaf : flat) out.push_back(decode_spec(at_key_path(specs, leaf)));
  return out;
}

json with_error(const json& captured, const char* ok_key) {
  if (captured.contains("error")) return json{{"error", captured["error"]}};
  return ok_key ? json{{ok_key, captured["ok"]}} : captured["ok"];
}

json eval_sharding_strategy(const json& /*file*/, const json& c) {
  const json& in = c.at("inputs");
  const std::string fn = in.at("fn");

  if (fn == "optimize_sharding_for_memory") {
    const auto flat = flatten_tree(in.at("tree"));
    std::optional<std::int64_t> max;
    if (!in["max_memory_per_device"].is_null())
      max = in["max_memory_per_device"].get<std::int64_t>();
    std::optional<std::vector<sharding::AxisRule>> names;
    if (!in["names"].is_null()) names = decode_rules(in["names"]);
    return with_error(capture([&] {
                        const auto specs = sharding::optimize_sharding_for_memory(
                            named_leaves(flat), decode_mesh(in.at("mesh")), max, names);
                        std::vector<json> leaves;
                        for (const auto& s : specs) leaves.push_back(spec_leaf(s));
                        return rebuild_tree(in.at("tree"), leaves);
                      }),
                      "tree");
  }

  if (fn == "validate_sharding_config") {
    const auto flat = flatten_tree(in.at("tree"));
    return with_error(
        capture([&] {
          return json(sharding::validate_sharding_config(
              named_leaves(flat), specs_along(in.at("specs"), flat), decode_mesh(in.at("mesh"))));
        }),
        "issues");
  }

  if (fn == "analyze_sharding_strategy") {
    const auto flat = flatten_tree(in.at("tree"));
    return with_error(capture([&] {
                        const auto a = sharding::analyze_sharding_strategy(
                            named_leaves(flat), specs_along(in.at("specs"), flat),
                            decode_mesh(in.at("mesh")));
                        json out{{"total_parameters", a.total_parameters},
                                 {"sharded_parameters", a.sharded_parameters}};
                        // eformer leaves memory_per_device, balance_score and partition_stats as
                        // placeholders ({}, 0.0, {}); numesh computes them, so these cases differ
                        // on purpose. docs/eformer-compat.md lists numesh's numbers, which the
                        // runner checks, and states that they differ from eformer's only at those
                        // three fields, so the runner also checks total_parameters and
                        // sharded_parameters against eformer's. sharding_strategy_test checks the
                        // computed fields on hand-worked examples.
                        out["memory_per_device"] = a.memory_per_device;
                        out["balance_score"] = a.balance_score;
                        json stats{{"leaves", a.partition_stats.leaves},
                                   {"sharded_leaves", a.partition_stats.sharded_leaves},
                                   {"replicated_leaves", a.partition_stats.replicated_leaves}};
                        for (const auto& [axis, n] : a.partition_stats.axis_usage)
                          stats["axis_usage"][axis] = n;
                        out["partition_stats"] = stats;
                        return out;
                      }),
                      nullptr);
  }

  if (fn == "convert_sharding_strategy") {
    sharding::NamedSpecs old_specs;
    for (const auto& [k, v] : in.at("old_specs").items()) old_specs.emplace_back(k, decode_spec(v));
    return with_error(capture([&] {
                        const auto specs = sharding::convert_sharding_strategy(
                            decode_array(in.at("array")), old_specs, decode_mesh(in.at("old_mesh")),
                            decode_mesh(in.at("new_mesh")), in.at("strategy").get<std::string>());
                        json out = json::object();
                        for (const auto& [k, s] : specs) out[k] = spec_leaf(s);
                        return out;
                      }),
                      "specs");
  }
  throw NotEvaluated("unknown function " + fn);
}

}  // namespace

NUMESH_CONFORMANCE_EVALUATOR("sharding_strategy.json", eval_sharding_strategy);

}  // namespace numesh::conformance
