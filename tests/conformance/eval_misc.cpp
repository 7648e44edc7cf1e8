// Evaluator for misc.json: eformer's small helpers (SPEC 9). The case
// `partition_manager_context_semantics` belongs to the PartitionManager evaluator.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "conformance.hpp"
#include "numesh/sharding/mesh_context.hpp"
#include "numesh/sharding/mesh_helpers.hpp"
#include "numesh/sharding/rule_matching.hpp"

namespace numesh::conformance {

namespace {

// A dynamically typed axis-name argument: a str, a list of str, or anything else.
std::vector<std::string> decode_names(const json& j) {
  if (j.is_string()) return {j.get<std::string>()};
  return j.get<std::vector<std::string>>();
}

json eval_misc(const json& file, const json& c) {
  const std::string id = c.at("id");
  if (id == "partition_manager_context_semantics") {
    return eval_partition_manager_context_semantics(file, c);
  }
  const json& in = c.at("inputs");
  const std::string fn = in.at("fn");
  std::optional<sharding::MeshScope> scope;
  if (in.contains("context_mesh") && !in["context_mesh"].is_null()) {
    scope.emplace(decode_mesh(in["context_mesh"]));
  }

  if (fn == "get_safe_hash_int") {
    return capture([&] {
      return json(sharding::get_safe_hash_int(in.at("text_str").get<std::string>(),
                                              in.at("algorithm").get<std::string>()));
    });
  }
  if (fn == "get_axes_size_in_mesh") {
    return capture([&] {
      std::optional<sharding::Mesh> mesh;
      if (!in.at("mesh").is_null()) mesh = decode_mesh(in["mesh"]);
      return json(sharding::get_axes_size_in_mesh(decode_rule(in.at("axis_names")),
                                                  mesh ? &*mesh : nullptr));
    });
  }
  if (fn == "get_names_from_partition_spec") {
    return capture([&] {
      const json& specs = in.at("specs");
      if (specs.is_object()) {
        std::map<std::string, sharding::PartitionSpec> m;
        for (const auto& [k, v] : specs.items()) m.emplace(k, decode_spec(v));
        return json(sharding::get_names_from_partition_spec(m));
      }
      std::vector<sharding::PartitionSpec> v;
      for (const json& s : specs) v.push_back(decode_spec(s));
      return json(sharding::get_names_from_partition_spec(v));
    });
  }
  if (fn == "get_mesh_axis_names") {
    // get_mesh_axis_names(mesh=None): the names of `mesh`, or of the context mesh when the case
    // gives none (or null); eformer's AssertionError without one is numesh's NoMeshError.
    return capture([&] {
      std::optional<sharding::Mesh> mesh;
      if (in.contains("mesh") && !in["mesh"].is_null()) mesh = decode_mesh(in["mesh"]);
      return json(sharding::get_mesh_axis_names(mesh ? &*mesh : nullptr));
    });
  }
  if (fn == "names_in_current_mesh") {
    return capture(
        [&] { return json(sharding::names_in_current_mesh(decode_names(in.at("names")))); });
  }
  if (fn == "create_pattern_based_partition_spec") {
    return capture([&] {
      std::optional<sharding::Mesh> mesh;
      if (in.contains("mesh") && !in["mesh"].is_null()) mesh = decode_mesh(in["mesh"]);
      // The generator ran these under a mesh unless the case says `"mesh": null`.
      std::optional<sharding::MeshScope> default_scope;
      if (!in.contains("mesh")) default_scope.emplace(sharding::Mesh({"dp"}, {1}));
      std::optional<sharding::PartitionSpec> default_spec;
      if (in.contains("default_spec")) default_spec = decode_spec(in["default_spec"]);
      const auto fn_spec = sharding::create_pattern_based_partition_spec(
          in.at("pattern").get<std::string>(), mesh ? &*mesh : nullptr, default_spec);
      json out = json::object();
      for (const json& name : in.value("names", json::array())) {
        out[name.get<std::string>()] = encode_spec(fn_spec(name.get<std::string>()));
      }
      return out;
    });
  }
  if (fn == "get_incontext_mesh") {
    return capture([&] {
      const sharding::Mesh& mesh = sharding::get_incontext_mesh(in.value("raise_error", true));
      return json{{"empty", mesh.empty()}};
    });
  }
  if (fn == "get_submesh_device_index+get_mesh_axis_size") {
    return capture([&] {
      const sharding::Mesh mesh = decode_mesh(in.at("mesh"));
      const auto names = decode_names(in.at("axis_names"));
      const auto coords = in.at("device_coords").get<std::vector<std::int64_t>>();
      return json{{"device_index", sharding::get_submesh_device_index(mesh, coords, names)},
                  {"axis_size", sharding::get_mesh_axis_size(mesh, names)}};
    });
  }
  throw NotEvaluated("unknown fn " + fn);
}

}  // namespace

NUMESH_CONFORMANCE_EVALUATOR("misc.json", eval_misc);

}  // namespace numesh::conformance
