#include "machine_options.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

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

runtime::Topology load_topology(const MachineOptions& o) {
  if (o.synthetic) return runtime::Topology::from_synthetic(*o.synthetic);
  if (o.xml) return runtime::Topology::from_xml(*o.xml);
  return runtime::Topology::discover();
}

runtime::PlacementOptions placement_options(const MachineOptions& o) {
  runtime::PlacementPolicy policy = runtime::PlacementPolicy::kNuma;
  try {
    policy = runtime::parse_placement_policy(o.policy);
  } catch (const ValueError&) {
    throw ValueError(fmt::format(
        "--policy '{}' is not a placement policy (choose numa, l3 or core)", o.policy));
  }
  NUMESH_CHECK(policy != runtime::PlacementPolicy::kExplicit, ValueError,
               "--policy 'explicit' needs cpusets, which the command line does not take (choose "
               "numa, l3 or core)");
  NUMESH_CHECK(o.max_threads >= 0, ValueError, "--threads {} is negative", o.max_threads);
  runtime::PlacementOptions p;
  p.policy = policy;
  p.use_smt = o.smt;
  p.max_threads_per_device = o.max_threads;
  return p;
}

}  // namespace numesh::tools
