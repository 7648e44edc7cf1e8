#include "mesh_options.hpp"

#include <CLI/CLI.hpp>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "parsers.hpp"
#include "ranks.hpp"

namespace numesh::tools {

void add_machine_options(CLI::App& cmd, MachineOptions& o, bool with_threads) {
  auto* synthetic = cmd.add_option("--synthetic", o.synthetic,
                                   "An hwloc synthetic description instead of this machine, "
                                   "e.g. 'package:2 numa:2 core:8 pu:2' (devices run unpinned)");
  auto* xml = cmd.add_option("--xml", o.xml,
                             "An hwloc XML export (lstopo --of xml) instead of this machine "
                             "(devices run unpinned)");
  synthetic->excludes(xml);
  xml->excludes(synthetic);
  cmd.add_option("--policy", o.policy, "How to cut the topology into devices: numa, l3 or core")
      ->capture_default_str();
  cmd.add_flag("--smt", o.smt, "One thread per PU (hardware thread) instead of one per core");
  if (with_threads) {
    cmd.add_option("--threads", o.max_threads, "Cap each device's thread count (0: no cap)")
        ->capture_default_str();
  }
}

void add_mesh_shape_options(CLI::App& cmd, MeshOptions& o) {
  cmd.add_option("--dims", o.dims, "Mesh dims, comma-separated; one -1 takes the rest")
      ->capture_default_str();
  cmd.add_option("--names", o.names, "Mesh axis names, comma-separated")->capture_default_str();
}

void add_mesh_options(CLI::App& cmd, MeshOptions& o, bool with_threads) {
  add_machine_options(cmd, o.machine, with_threads);
  add_mesh_shape_options(cmd, o);
}

runtime::Topology load_topology(const MachineOptions& o) {
  if (o.synthetic) return runtime::Topology::from_synthetic(*o.synthetic);
  if (o.xml) return runtime::Topology::from_xml(*o.xml);
  return runtime::Topology::discover();
}

runtime::PlacementOptions placement_options(const MachineOptions& o) {
  const runtime::PlacementPolicy policy = parse_policy_option(o.policy);
  NUMESH_CHECK(o.max_threads >= 0, ValueError, "--threads {} is negative", o.max_threads);
  runtime::PlacementOptions p;
  p.policy = policy;
  p.use_smt = o.smt;
  p.max_threads_per_device = o.max_threads;
  return p;
}

std::shared_ptr<runtime::DeviceSet> make_devices(const MachineOptions& o) {
  const runtime::PlacementOptions placement = placement_options(o);
  return runtime::DeviceSet::create(load_topology(o), placement);
}

void check_mesh_options(const MeshOptions& o) { (void)parse_int_list(o.dims, "--dims"); }

runtime::DeviceMesh make_mesh(const MeshOptions& o) {
  const std::vector<std::int64_t> dims = parse_int_list(o.dims, "--dims");
  const std::vector<std::string> names = parse_names(o.names);
  // Under mpirun every rank makes its devices from the cores it was bound to, and the mesh is
  // every rank's devices in rank order; a rank whose set-up fails stops all of them.
  runtime::Transport& world = *command_world();
  std::shared_ptr<runtime::DeviceSet> devices;
  if (world.size() == 1) {
    devices = make_devices(o.machine);
  } else {
    on_every_rank(world, [&] { devices = make_devices(o.machine); });
  }
  return runtime::DeviceMesh::create(std::move(devices), command_world(), dims, names);
}

}  // namespace numesh::tools
