#include "bench_common.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <ostream>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/units.hpp"
#include "numesh/runtime/device_buffer.hpp"
#include "numesh/runtime/device_placement.hpp"
#include "numesh/runtime/topology.hpp"

namespace numesh::tools {

namespace {

// The memory hwloc reports for node `node`, or 0 when unknown (no such node, or no size).
std::uint64_t node_memory(const runtime::Topology& topology, int node) {
  if (node < 0 || static_cast<std::size_t>(node) >= topology.numa_nodes().size()) return 0;
  return topology.numa_nodes()[static_cast<std::size_t>(node)].memory_bytes;
}

}  // namespace

void check_device_nodes_fit(const runtime::DeviceSet& devices, std::string_view option,
                            std::size_t bytes, int arrays, std::string_view what) {
  const auto needed = static_cast<std::uint64_t>(arrays) * bytes;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const runtime::DeviceSpec& spec = devices.device(i).spec();
    const std::uint64_t has = node_memory(devices.topology(), spec.numa_node);
    NUMESH_CHECK(has == 0 || needed <= has, ValueError,
                 "{} {}: {} of that size ({}) on NUMA node {} of device {} ({}), which has {} "
                 "as hwloc reports it; choose a smaller {}",
                 option, human_bytes(bytes), what, human_bytes(needed), spec.numa_node, spec.index,
                 spec.label, human_bytes(has), option);
  }
}

void check_all_nodes_fit(const runtime::DeviceSet& devices, std::string_view option,
                         std::size_t bytes) {
  for (const runtime::NumaNode& node : devices.topology().numa_nodes()) {
    NUMESH_CHECK(node.memory_bytes == 0 || bytes <= node.memory_bytes, ValueError,
                 "{} {}: the node matrix places that much on every NUMA node, and node {} has "
                 "{} as hwloc reports it; choose a smaller {} (or --no-matrix)",
                 option, human_bytes(bytes), node.index, human_bytes(node.memory_bytes), option);
  }
}

nlohmann::json machine_json(const runtime::DeviceSet& devices) {
  const runtime::Topology& topology = devices.topology();
  nlohmann::json nodes = nlohmann::json::array();
  for (const runtime::NumaNode& n : topology.numa_nodes()) {
    nodes.push_back({{"index", n.index},
                     {"os_index", n.os_index},
                     {"cpuset", n.cpuset.to_string()},
                     {"memory_bytes", n.memory_bytes}});
  }
  nlohmann::json devs = nlohmann::json::array();
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const runtime::Device& d = devices.device(i);
    devs.push_back({{"index", d.index()},
                    {"label", d.spec().label},
                    {"cpuset", d.spec().cpuset.to_string()},
                    {"threads", d.spec().threads},
                    {"numa_node", d.spec().numa_node},
                    {"pinning", std::string(runtime::to_string(d.pinning()))},
                    {"memory_binding", std::string(runtime::to_string(d.memory_binding()))}});
  }
  const runtime::PlacementOptions& placement = devices.options();
  return {{"topology",
           {{"source", std::string(runtime::to_string(topology.source()))},
            {"origin", topology.origin()},
            {"can_bind", topology.can_bind()},
            {"numa_nodes", std::move(nodes)}}},
          {"policy", std::string(runtime::to_string(placement.policy))},
          {"smt", placement.use_smt},
          {"max_threads", placement.max_threads_per_device},
          {"devices", std::move(devs)},
          {"notes", devices.notes()}};
}

void write_devices_text(const runtime::DeviceSet& devices, std::ostream& out) {
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const runtime::Device& d = devices.device(i);
    const runtime::DeviceSpec& s = d.spec();
    const std::string pinning = d.pinning() == runtime::Pinning::kUnpinned
                                    ? std::string("unpinned")
                                    : fmt::format("pinned ({})", runtime::to_string(d.pinning()));
    out << fmt::format("  device {} {}: cpus {}, {} thread{}, NUMA node {}, {}, memory {}\n",
                       s.index, s.label, s.cpuset.to_string(), s.threads, s.threads == 1 ? "" : "s",
                       s.numa_node < 0 ? std::string("none") : std::to_string(s.numa_node), pinning,
                       runtime::to_string(d.memory_binding()));
  }
  for (const std::string& note : devices.notes()) out << "note: " << note << "\n";
}

std::ofstream open_json_file(const std::string& path) {
  std::ofstream file;
  if (path.empty()) return file;
  file.open(path);
  NUMESH_CHECK(file.is_open(), IoError, "cannot write --json file '{}'", path);
  return file;
}

}  // namespace numesh::tools
