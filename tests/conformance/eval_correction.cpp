// Evaluator for corrected_sharding.json: eformer's get_corrected_named_sharding (gcns/*) and
// with_sharding_constraint (wsc/*, wsc_named_sharding/*) (SPEC 6).

#include <optional>
#include <string>
#include <vector>

#include "conformance.hpp"
#include "numesh/sharding/corrected_sharding.hpp"
#include "numesh/sharding/mesh_context.hpp"
#include "tree_codec.hpp"

namespace numesh::conformance {
namespace {

json encode_constraint(const std::optional<sharding::NamedSharding>& applied) {
  if (!applied) return json{{"constraint_applied", false}, {"returned_same_object", true}};
  return json{{"constraint_applied", true}, {"applied_spec", encode_spec(applied->spec())}};
}

// The wsc/pytree encoding writes arrays as bare {"shape": [...]} objects; tree_codec expects
// {"$array": {...}}.
json mark_arrays(const json& tree) {
  if (tree.is_object()) {
    if (tree.contains("shape") && tree["shape"].is_array()) return json{{"$array", tree}};
    json out = json::object();
    for (const auto& [k, v] : tree.items()) out[k] = mark_arrays(v);
    return out;
  }
  if (tree.is_array()) {
    json out = json::array();
    for (const auto& v : tree) out.push_back(mark_arrays(v));
    return out;
  }
  return tree;
}

json eval_gcns(const json& in) {
  std::optional<sharding::MeshScope> scope;
  if (!in.at("mesh").is_null()) scope.emplace(decode_mesh(in["mesh"]));
  const bool raise = in.value("raise_mesh_error", true);
  const json r = capture([&] {
    std::vector<std::string> warnings;
    const auto sharding = sharding::get_corrected_named_sharding(
        decode_shape(in.at("shape")), decode_spec(in.at("spec")), raise, &warnings);
    json out{{"spec", encode_spec(sharding.spec())}, {"warnings", warnings}};
    if (sharding.mesh().empty()) out["mesh_empty"] = true;
    return out;
  });
  return r.contains("error") ? json{{"error", r["error"]}} : r["ok"];
}

// eformer's with_sharding_constraint(arr, sharding) accepts a P or a NamedSharding; any other
// sharding (a plain tuple or list, a string) raises TypeError("Unsupported sharding type: ...")
// for an array leaf. numesh's sharding argument is typed, so such a call does not compile.
constexpr const char* kUntypedSharding =
    "a sharding that is neither P nor NamedSharding does not type-check in C++";

// True when the case passes the sharding as something other than a P or a NamedSharding: a
// `sharding` (not `spec`) argument, a `spec` that is not a spec list, or a case that says the
// sharding is a tuple.
bool untyped_sharding(const json& in) {
  if (in.contains("named_sharding_spec")) return false;
  if (!in.contains("spec")) return true;
  const json& spec = in["spec"];
  const bool encoded_leaf = spec.is_object() && (spec.contains("$spec") || spec.contains("$pspec"));
  if (!spec.is_array() && !encoded_leaf) return true;
  // The encoding cannot tell a tuple from a list from a P, so a case marks it: a flag such as
  // `spec_is_tuple`, or a `..._type` / `..._kind` field naming the Python type.
  for (const auto& [key, v] : in.items()) {
    if (key.find("tuple") != std::string::npos && v.is_boolean() && v.get<bool>()) return true;
    const bool names_type =
        key.find("type") != std::string::npos || key.find("kind") != std::string::npos;
    if (!names_type || !v.is_string()) continue;
    const std::string t = v.get<std::string>();
    if (t.find("tuple") != std::string::npos || t.find("list") != std::string::npos || t == "str" ||
        t.find("'str'") != std::string::npos) {
      return true;
    }
  }
  return false;
}

// The value being constrained: the case's `tree` (a pytree), else its `array`, else the first
// of the names the vectors use for a plain Python value. Null when the case gives none.
const json& constrained_value(const json& in) {
  static const json kNone = nullptr;
  for (const char* key : {"tree", "array", "value", "x", "arr", "scalar"}) {
    if (in.contains(key)) return in[key];
  }
  return kNone;
}

bool is_array_value(const json& v) {
  return v.is_object() && ((v.contains("shape") && v["shape"].is_array()) || v.contains("$array"));
}

json eval_wsc(const json& in) {
  // The P form constrains on the context mesh, which the vectors give as `mesh`; the
  // NamedSharding form carries `mesh` itself and runs under `context_mesh`.
  const bool named_form = in.contains("named_sharding_spec");
  std::optional<sharding::MeshScope> scope;
  const json& context = named_form ? in.at("context_mesh") : in.value("mesh", json(nullptr));
  if (!context.is_null()) scope.emplace(decode_mesh(context));

  const json& value = constrained_value(in);
  const bool is_tree =
      in.contains("tree") && (value.is_object() || value.is_array()) && !is_array_value(value);
  if (!is_tree && !is_array_value(value)) {
    // A Python value that is not an array (a scalar, a string, None): eformer checks for an
    // array before it looks at the sharding, and returns the value itself. numesh's nearest
    // form is a leaf without an array, which with_sharding_constraint_tree leaves alone.
    const std::vector<sharding::NamedLeaf> leaf{sharding::NamedLeaf{"", std::nullopt}};
    const json r = capture([&] {
      const sharding::PartitionSpec spec = in.contains("spec") && in["spec"].is_array()
                                               ? decode_spec(in["spec"])
                                               : sharding::PartitionSpec();
      return encode_constraint(sharding::with_sharding_constraint_tree(leaf, spec).at(0));
    });
    return r.contains("error") ? json{{"error", r["error"]}} : r["ok"];
  }
  if (untyped_sharding(in)) throw NotEvaluated(kUntypedSharding);

  const json r = capture([&]() -> json {
    if (is_tree) {
      const json tree = mark_arrays(value);
      const auto flat = flatten_tree(tree);
      std::vector<sharding::NamedLeaf> leaves;
      for (const FlatLeaf& f : flat) leaves.push_back(to_named_leaf(f));
      const auto results =
          sharding::with_sharding_constraint_tree(leaves, decode_spec(in.at("spec")));
      json applied = json::array();
      json non_array = nullptr;
      for (std::size_t i = 0; i < leaves.size(); ++i) {
        if (leaves[i].array) {
          applied.push_back(results[i] ? encode_spec(results[i]->spec()) : json(nullptr));
        } else {
          non_array = *flat[i].value;
        }
      }
      return json{{"applied_specs_in_leaf_order", applied},
                  {"non_array_leaf_returned", non_array},
                  {"none_kept", true}};
    }
    const json& array = value.contains("$array") ? value["$array"] : value;
    const auto shape = decode_shape(array.at("shape"));
    if (named_form) {
      const sharding::NamedSharding ns(decode_mesh(in.at("mesh")),
                                       decode_spec(in["named_sharding_spec"]));
      return encode_constraint(sharding::with_sharding_constraint(shape, ns));
    }
    return encode_constraint(sharding::with_sharding_constraint(shape, decode_spec(in.at("spec"))));
  });
  return r.contains("error") ? json{{"error", r["error"]}} : r["ok"];
}

json eval_corrected_sharding(const json& /*file*/, const json& c) {
  const std::string id = c.at("id");
  const json& in = c.at("inputs");
  if (id.rfind("gcns", 0) == 0) return eval_gcns(in);
  return eval_wsc(in);
}

}  // namespace

NUMESH_CONFORMANCE_EVALUATOR("corrected_sharding.json", eval_corrected_sharding);

}  // namespace numesh::conformance
