#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "conversions.hpp"
#include "numesh/core/error.hpp"
#include "numesh/sharding/axis_rule.hpp"
#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/partition_spec.hpp"
#include "numesh/sharding/rule_matching.hpp"
#include "numesh/sharding/sharding_rules.hpp"
#include "numesh/sharding/sharding_strategy.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

// The functions here take a pytree flattened by the package (numesh/pytree.py): `leaves` is a
// list of (path, leaf) pairs in JAX's order, and a list of specs, when there is one, holds the
// spec of each leaf in that order. The package's wrappers (numesh/rules.py, numesh/helpers.py)
// flatten the caller's tree and rebuild the result in its structure.

namespace numesh::python {

namespace {

using sharding::Mesh;
using sharding::PartitionSpec;
using sharding::ShardingRule;

// eformer's analysis dict, with the three fields it leaves as placeholders filled in.
py::dict analysis_dict(const sharding::ShardingAnalysis& a) {
  py::dict usage;
  for (const auto& [axis, n] : a.partition_stats.axis_usage) usage[py::str(axis)] = n;
  py::dict stats;
  stats["leaves"] = a.partition_stats.leaves;
  stats["sharded_leaves"] = a.partition_stats.sharded_leaves;
  stats["replicated_leaves"] = a.partition_stats.replicated_leaves;
  stats["axis_usage"] = usage;
  py::dict out;
  out["total_parameters"] = a.total_parameters;
  out["sharded_parameters"] = a.sharded_parameters;
  out["memory_per_device"] = a.memory_per_device;
  out["balance_score"] = a.balance_score;
  out["partition_stats"] = stats;
  return out;
}

// eformer's dict of named specs, in its order; names are str(key).
sharding::NamedSpecs named_specs(const py::dict& specs) {
  sharding::NamedSpecs out;
  for (const auto& [key, spec] : specs) {
    out.emplace_back(py::str(key).cast<std::string>(), spec.cast<PartitionSpec>());
  }
  return out;
}

// Rules keyed by a leaf's name (constraints.py).
void bind_name_rules(py::module_& m) {
  m.def(
      "_match_partition_rules",
      [](const std::vector<std::pair<std::string, PartitionSpec>>& rules, py::handle leaves,
         std::optional<std::int64_t> min_size, bool strict) {
        std::vector<sharding::PartitionRule> partition_rules;
        for (const auto& [pattern, spec] : rules) partition_rules.push_back({pattern, spec});
        return sharding::match_partition_rules(partition_rules, to_named_leaves(leaves), min_size,
                                               strict);
      },
      "rules"_a, "leaves"_a, "min_size"_a, "strict"_a,
      "match_partition_rules over flattened leaves: one spec per leaf (numesh.rules wraps it).");

  py::class_<sharding::PatternPartitionSpec>(
      m, "PatternPartitionSpec",
      "What create_pattern_based_partition_spec returns: called with a parameter name (and, as "
      "eformer's function, an array it ignores), the spec of the first rule whose pattern is "
      "found in the name, else the default spec.")
      .def(
          "__call__",
          [](const sharding::PatternPartitionSpec& fn, const std::string& name, const py::object&) {
            return fn(name);
          },
          "name"_a, "array"_a = py::none(), "The spec for the parameter called `name`.")
      .def_property_readonly(
          "rules",
          [](const sharding::PatternPartitionSpec& fn) {
            py::list out;
            for (const auto& rule : fn.rules()) out.append(py::make_tuple(rule.pattern, rule.spec));
            return out;
          },
          "The (pattern, spec) rules, in the order they are tried.")
      .def_property_readonly("default_spec", &sharding::PatternPartitionSpec::default_spec,
                             "The spec of names no rule matches.");
  m.def(
      "create_pattern_based_partition_spec",
      [](const std::string& pattern, const std::optional<Mesh>& mesh,
         std::optional<PartitionSpec> default_spec) {
        return sharding::create_pattern_based_partition_spec(pattern, mesh ? &*mesh : nullptr,
                                                             std::move(default_spec));
      },
      "pattern"_a, "mesh"_a = py::none(), "default_spec"_a = py::none(), R"pbdoc(
eformer's create_pattern_based_partition_spec: rules from "regex|regex->axis.axis,regex->axis"
(split on ',', a piece without "->" ignored, an empty axis None, nothing trimmed), as a callable
PatternPartitionSpec; names no rule matches get `default_spec` (default P()). A mesh is required
(`mesh`, or the current one: AssertionError without) but not used, as in eformer. Raises
ValueError "too many values to unpack (expected 2)" for a piece with two "->", ValueError for a
pattern numesh cannot run (Python-only syntax such as lookbehind).
)pbdoc");
}

// The whole-tree strategies of auto_spec.py.
void bind_strategies(py::module_& m) {
  m.def(
      "_optimize_sharding_for_memory",
      [](py::handle leaves, const std::optional<Mesh>& mesh, std::optional<std::int64_t> max_memory,
         const std::optional<std::vector<sharding::AxisRule>>& names) {
        return sharding::optimize_sharding_for_memory(to_named_leaves(leaves), mesh, max_memory,
                                                      names);
      },
      "leaves"_a, "mesh"_a, "max_memory_per_device"_a, "names"_a,
      "optimize_sharding_for_memory over flattened leaves (numesh.rules wraps it).");
  m.def(
      "_validate_sharding_config",
      [](py::handle leaves, const std::vector<PartitionSpec>& specs,
         const std::optional<Mesh>& mesh) {
        return sharding::validate_sharding_config(to_named_leaves(leaves), specs, mesh);
      },
      "leaves"_a, "specs"_a, "mesh"_a,
      "validate_sharding_config over flattened leaves and their specs (numesh.rules wraps it).");
  m.def(
      "_analyze_sharding_strategy",
      [](py::handle leaves, const std::vector<PartitionSpec>& specs,
         const std::optional<Mesh>& mesh) {
        return analysis_dict(
            sharding::analyze_sharding_strategy(to_named_leaves(leaves), specs, mesh));
      },
      "leaves"_a, "specs"_a, "mesh"_a,
      "analyze_sharding_strategy over flattened leaves and their specs (numesh.rules wraps it).");
  m.def(
      "convert_sharding_strategy",
      [](const py::object& array, const py::dict& old_partition_specs, const Mesh& old_mesh,
         const Mesh& new_mesh, const std::string& strategy) {
        // One result per entry, in the dict's order: each under the caller's own key (numesh
        // names the entries by str(key) only to carry them).
        const auto converted = sharding::convert_sharding_strategy(
            to_array_info(array), named_specs(old_partition_specs), old_mesh, new_mesh, strategy);
        py::dict out;
        if (converted.empty()) return out;  // an unknown strategy: eformer's {}
        std::size_t at = 0;
        for (const auto& [key, spec] : old_partition_specs) {
          out[key] = converted.at(at++).second;
        }
        return out;
      },
      "array"_a, "old_partition_specs"_a, "old_mesh"_a, "new_mesh"_a,
      "strategy"_a = "preserve_balance", R"pbdoc(
eformer's convert_sharding_strategy: for "preserve_balance", each name's spec on `new_mesh` is
auto_partition_spec(array, new_mesh) with the old spec's parallel factor (the product of its
axes' sizes on `old_mesh`) as the minimum size; the same `array` serves every name, as in
eformer. Any other strategy gives {} (eformer's silence). Raises KeyError for an axis
`old_mesh` lacks, TypeError for an `array` without a shape and a dtype.
)pbdoc");
}

// The abstract base binds apply(); each rule class only adds its constructor.
template <typename Rule>
using RuleClass = py::class_<Rule, ShardingRule, std::shared_ptr<Rule>>;

// escale.helpers' classes, each wrapped by its namesake in numesh.helpers, which keeps the
// C++ rule so that CompositeShardingRule can combine them in C++.
void bind_rule_classes(py::module_& m) {
  py::class_<ShardingRule, std::shared_ptr<ShardingRule>>(
      m, "_ShardingRule", "A rule of eformer.escale.helpers (numesh.helpers wraps each).")
      .def(
          "apply",
          [](const ShardingRule& rule, py::handle leaves) {
            return rule.apply(to_named_leaves(leaves));
          },
          "leaves"_a, "One spec per flattened leaf, in their order.");
  RuleClass<sharding::AutoShardingRule>(m, "_AutoShardingRule", "AutoShardingRule's C++ half.")
      .def(py::init<const std::optional<Mesh>&, std::optional<std::vector<std::string>>,
                    std::optional<std::int64_t>, bool>(),
           "mesh"_a, "axis_names"_a, "min_shard_size"_a, "reverse"_a);
  RuleClass<sharding::MemoryConstrainedShardingRule>(m, "_MemoryConstrainedShardingRule",
                                                     "MemoryConstrainedShardingRule's C++ half.")
      .def(py::init<std::int64_t, const std::optional<Mesh>&,
                    std::optional<std::vector<std::string>>>(),
           "max_memory_per_device"_a, "mesh"_a, "axis_names"_a);
  RuleClass<sharding::ShapeBasedShardingRule>(m, "_ShapeBasedShardingRule",
                                              "ShapeBasedShardingRule's C++ half.")
      .def(py::init<std::vector<std::pair<sharding::ShapePattern, PartitionSpec>>>(),
           "shape_patterns"_a);
  RuleClass<sharding::CompositeShardingRule>(m, "_CompositeShardingRule",
                                             "CompositeShardingRule's C++ half.")
      .def(py::init([](const std::vector<std::shared_ptr<ShardingRule>>& rules) {
             std::vector<std::shared_ptr<const ShardingRule>> all;
             for (const auto& rule : rules) {
               if (!rule) throw TypeError("CompositeShardingRule takes rules, got None");
               all.push_back(rule);
             }
             return std::make_shared<sharding::CompositeShardingRule>(std::move(all));
           }),
           "rules"_a);

  py::class_<sharding::ShardingAnalyzer>(m, "_ShardingAnalyzer", "ShardingAnalyzer's C++ half.")
      .def(py::init<const std::optional<Mesh>&>(), "mesh"_a)
      .def(
          "validate_partition_specs",
          [](const sharding::ShardingAnalyzer& a, py::handle leaves,
             const std::vector<PartitionSpec>& specs) {
            return a.validate_partition_specs(to_named_leaves(leaves), specs);
          },
          "leaves"_a, "specs"_a, "The issues of flattened leaves and their specs.")
      .def(
          "estimate_memory_usage",
          [](const sharding::ShardingAnalyzer& a, py::handle leaves,
             const std::vector<PartitionSpec>& specs) {
            const auto usage = a.estimate_memory_usage(to_named_leaves(leaves), specs);
            py::dict out;
            out["total_size"] = usage.total_size;
            out["size_per_device"] = usage.size_per_device;
            return out;
          },
          "leaves"_a, "specs"_a,
          "{'total_size', 'size_per_device'} of flattened leaves and their specs.");
}

}  // namespace

void bind_rules(py::module_& m) {
  bind_name_rules(m);
  bind_strategies(m);
  bind_rule_classes(m);
}

}  // namespace numesh::python
