// Evaluator for auto_partition_spec.json: eformer's auto_partition_spec and
// vrn_auto_partition_spec (SPEC 8.1).

#include <optional>

#include "conformance.hpp"
#include "numesh/sharding/auto_spec.hpp"
#include "numesh/sharding/mesh_context.hpp"
#include "tree_codec.hpp"

namespace numesh::conformance {
namespace {

json eval_auto_partition_spec(const json& /*file*/, const json& c) {
  const json& in = c.at("inputs");
  const std::string fn = in.at("fn");
  if (in.contains("value")) {
    // eformer's TypeError for a non-array `x`: numesh's signature takes an ArrayInfo, so the
    // call cannot be written (docs/eformer-compat.md).
    throw NotEvaluated("a non-array argument does not type-check in C++");
  }
  const sharding::ArrayInfo array = decode_array(in.at("array"));

  std::optional<sharding::Mesh> mesh;
  if (in.contains("mesh")) mesh = decode_mesh(in["mesh"]);
  std::optional<sharding::MeshScope> scope;
  if (in.contains("context_mesh") && !in["context_mesh"].is_null()) {
    scope.emplace(decode_mesh(in["context_mesh"]));
  }

  std::optional<std::vector<sharding::AxisRule>> names;
  // `names_tuple` is the same list passed as a Python tuple; numesh's names are a sequence.
  for (const char* key : {"names", "names_tuple"}) {
    if (in.contains(key) && !in[key].is_null()) names = decode_rules(in[key]);
  }
  std::optional<std::int64_t> min_size;
  if (in.contains("min_sharding_size") && !in["min_sharding_size"].is_null()) {
    min_size = in["min_sharding_size"].get<std::int64_t>();
  }
  const bool reverse =
      in.contains("reverse") && in["reverse"].is_boolean() && in["reverse"].get<bool>();

  const json result = capture([&] {
    const auto spec = fn == "vrn_auto_partition_spec"
                          ? sharding::vrn_auto_partition_spec(array, mesh, names, min_size, reverse)
                          : sharding::auto_partition_spec(array, mesh, names, min_size, reverse);
    return encode_spec(spec);
  });
  if (result.contains("error")) return json{{"error", result["error"]}};
  return json{{"spec", result["ok"]}};
}

}  // namespace

NUMESH_CONFORMANCE_EVALUATOR("auto_partition_spec.json", eval_auto_partition_spec);

}  // namespace numesh::conformance
