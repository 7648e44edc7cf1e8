// Evaluator for mesh.json: mesh shape resolution, create_mesh, calculate_host_mesh_shape,
// _normalize_axis_types, fill_minus_one_to_target, parse_mesh_from_string and
// MeshPartitionHelper (SPEC 10).

#include <string>
#include <vector>

#include "conformance.hpp"
#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/mesh_creation.hpp"

namespace numesh::conformance {
namespace {

using Shape = std::vector<std::int64_t>;

json encode_methods(const std::vector<sharding::MeshPartitionHelper::Method>& methods) {
  json out = json::array();
  for (const auto& m : methods) out.push_back(m);
  return out;
}

json eval_mesh(const json& /*file*/, const json& c) {
  const json& in = c.at("inputs");
  const std::string fn = in.at("fn");
  if (fn == "np.arange(n_devices).reshape(axis_dims).shape") {
    return capture([&] {
      return json(sharding::resolve_mesh_dims(in.at("axis_dims").get<Shape>(),
                                              in.at("n_devices").get<std::int64_t>()));
    });
  }
  if (fn == "create_mesh") {
    return capture([&] {
      sharding::CreateMeshOptions options;
      options.device_count = in.at("n_devices").get<std::int64_t>();
      options.process_count = in.value("process_count", std::int64_t{1});
      if (in.contains("dcn_mesh_dims") && !in["dcn_mesh_dims"].is_null()) {
        options.dcn_mesh_dims = in["dcn_mesh_dims"].get<Shape>();
      }
      return encode_mesh(sharding::create_mesh(in.at("axis_dims").get<Shape>(),
                                               in.at("axis_names").get<std::vector<std::string>>(),
                                               options));
    });
  }
  if (fn == "calculate_host_mesh_shape") {
    return capture([&] {
      return json(sharding::calculate_host_mesh_shape(in.at("global_mesh_shape").get<Shape>(),
                                                      in.at("total_devices").get<std::int64_t>(),
                                                      in.at("num_processes").get<std::int64_t>()));
    });
  }
  if (fn == "_normalize_axis_types") {
    return capture([&] {
      const auto types = sharding::normalize_axis_types(
          in.at("axis_names").get<std::vector<std::string>>(), in.at("axis_types"));
      if (!types) return json(nullptr);
      json out = json::array();
      for (auto t : *types) out.push_back(std::string(sharding::to_string(t)));
      return out;
    });
  }
  if (fn == "fill_minus_one_to_target") {
    return capture([&] {
      return json(sharding::fill_minus_one_to_target(in.at("shape").get<Shape>(),
                                                     in.at("target").get<std::int64_t>()));
    });
  }
  if (fn == "parse_mesh_from_string") {
    return capture([&] {
      const auto parsed = sharding::parse_mesh_from_string(
          in.at("axis_dims").get<std::string>(), in.at("names").get<std::vector<std::string>>());
      return json{{"axis_dims", parsed.axis_dims}, {"axis_names", parsed.axis_names}};
    });
  }
  if (fn == "MeshPartitionHelper") {
    return capture([&] {
      const sharding::MeshPartitionHelper helper(decode_mesh(in.at("mesh")));
      const Shape shape = in.at("shape").get<Shape>();
      const auto methods = helper.suggest_methods(shape);
      return json{{"methods", encode_methods(methods)},
                  {"spec_min1024", encode_spec(helper.create_partition_spec(shape, methods, 1024))},
                  {"spec_min1", encode_spec(helper.create_partition_spec(shape, methods, 1))}};
    });
  }
  throw NotEvaluated("unknown fn " + fn);
}

}  // namespace

NUMESH_CONFORMANCE_EVALUATOR("mesh.json", eval_mesh);

}  // namespace numesh::conformance
