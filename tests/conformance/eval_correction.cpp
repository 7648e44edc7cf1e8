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

json eval_wsc(const json& in) {
  // The P form constrains on the context mesh, which the vectors give as `mesh`; the
  // NamedSharding form carries `mesh` itself and runs under `context_mesh`.
  const bool named_form = in.contains("named_sharding_spec");
  std::optional<sharding::MeshScope> scope;
  const json& context = named_form ? in.at("context_mesh") : in.at("mesh");
  if (!context.is_null()) scope.emplace(decode_mesh(context));

  const json r = capture([&]() -> json {
    if (in.contains("tree")) {
      const json tree = mark_arrays(in["tree"]);
      std::vector<sharding::NamedLeaf> leaves;
      for (const FlatLeaf& f : flatten_tree(tree)) leaves.push_back(to_named_leaf(f));
      const auto results = sharding::with_sharding_constraint_tree(leaves, decode_spec(in.at("spec")));
      json applied = json::array();
      json non_array = nullptr;
      const auto flat = flatten_tree(tree);
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
    if (!named_form && !in.contains("spec")) {
      throw NotEvaluated("a sharding that is neither P nor NamedSharding does not type-check in C++");
    }
    if (!in.contains("array")) {
      // A Python value that is not an array is returned untouched.
      return json{{"constraint_applied", false}, {"returned_same_object", true}};
    }
    const auto shape = decode_shape(in["array"].at("shape"));
    if (named_form) {
      const sharding::NamedSharding ns(decode_mesh(in.at("mesh")),
                                       decode_spec(in["named_sharding_spec"]));
      return encode_constraint(sharding::with_sharding_constraint(shape, ns));
    }
    if (in.contains("spec") && !in["spec"].is_array()) {
      throw NotEvaluated("a sharding that is neither P nor NamedSharding does not type-check in C++");
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
