#include "topology_command.hpp"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "numesh/core/error.hpp"
#include "numesh/ops/kernels/blas_core.hpp"
#include "numesh/runtime/cpu_features.hpp"
#include "render.hpp"

namespace numesh::tools {

using json = nlohmann::json;

namespace {

// How OpenBLAS's core came to be: numesh's restart (main.cpp), the caller's OPENBLAS_CORETYPE or
// OpenBLAS's own choice.
std::string openblas_core_note() {
  if (const char* chose = std::getenv("NUMESH_OPENBLAS_CHOSE"); chose != nullptr) {
    return fmt::format(" (set by numesh: OpenBLAS had chosen {}, older than this CPU)", chose);
  }
  if (const char* set = std::getenv("OPENBLAS_CORETYPE"); set != nullptr) {
    return fmt::format(" (OPENBLAS_CORETYPE={})", set);
  }
  return " (OpenBLAS's choice)";
}

using runtime::CpuSet;
using runtime::DeviceSpec;
using runtime::PlacementOptions;
using runtime::PlacementPolicy;
using runtime::Topology;

// "1 package", "2 packages".
std::string count_of(std::size_t n, std::string_view noun) {
  return fmt::format("{} {}{}", n, noun, n == 1 ? "" : "s");
}

std::string pus_text(const CpuSet& cpus) {
  return cpus.empty() ? std::string("none") : cpus.to_string();
}

// Ascending, with -1 ("none") last.
void sort_ids(std::vector<int>& ids) {
  std::sort(ids.begin(), ids.end(), [](int a, int b) {
    if ((a < 0) != (b < 0)) return b < 0;
    return a < b;
  });
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
}

std::string source_text(const Topology& t) {
  switch (t.source()) {
    case runtime::TopologySource::kMachine:
      return "this machine";
    case runtime::TopologySource::kSynthetic:
      return fmt::format("synthetic '{}'", t.origin());
    case runtime::TopologySource::kXml:
      return fmt::format("xml '{}'", t.origin());
  }
  return "";
}

// The cores of package `p` and node `n`, grouped under their L3 (cores without one last).
void render_cores(const Topology& t, int p, int n, const std::string& indent, std::ostream& out) {
  std::vector<int> groups;
  for (const runtime::Core& c : t.cores()) {
    if (c.package == p && c.numa_node == n) groups.push_back(c.l3_group);
  }
  sort_ids(groups);
  for (const int g : groups) {
    std::string core_indent = indent;
    if (g >= 0) {
      const runtime::CacheGroup& l3 = t.l3_groups()[static_cast<std::size_t>(g)];
      out << fmt::format("{}L3 {} ({}): PUs {}\n", indent, g, human_bytes(l3.size_bytes),
                         pus_text(l3.cpuset));
      core_indent += "  ";
    }
    for (const runtime::Core& c : t.cores()) {
      if (c.package == p && c.numa_node == n && c.l3_group == g) {
        out << fmt::format("{}core {}: PUs {}\n", core_indent, c.index, c.pus);
      }
    }
  }
}

// Packages hold NUMA nodes, which hold L3 groups, which hold cores. Real machines do not always
// nest that way (a node attached above its package, PUs without a node), so each level is
// keyed by what the level below says it belongs to, and "(no ...)" entries catch the rest.
void render_tree(const Topology& t, std::ostream& out) {
  std::vector<int> packages;
  for (const runtime::Package& p : t.packages()) packages.push_back(p.index);
  for (const runtime::NumaNode& n : t.numa_nodes()) packages.push_back(n.package);
  for (const runtime::Core& c : t.cores()) packages.push_back(c.package);
  sort_ids(packages);
  out << "machine\n";
  for (const int p : packages) {
    if (p >= 0) {
      const runtime::Package& pkg = t.packages()[static_cast<std::size_t>(p)];
      out << fmt::format("  package {} (P#{}): PUs {}\n", p, pkg.os_index, pus_text(pkg.cpuset));
    } else {
      out << "  (no package)\n";
    }
    std::vector<int> nodes;
    for (const runtime::NumaNode& n : t.numa_nodes()) {
      if (n.package == p) nodes.push_back(n.index);
    }
    for (const runtime::Core& c : t.cores()) {
      if (c.package == p) nodes.push_back(c.numa_node);
    }
    sort_ids(nodes);
    for (const int n : nodes) {
      if (n >= 0) {
        const runtime::NumaNode& node = t.numa_nodes()[static_cast<std::size_t>(n)];
        out << fmt::format(
            "    NUMA node {} (P#{}, {}): PUs {}\n", n, node.os_index,
            human_bytes(node.memory_bytes),
            node.cpuset.empty() ? std::string("none (memory only)") : node.cpuset.to_string());
      } else {
        out << "    (no NUMA node)\n";
      }
      render_cores(t, p, n, "      ", out);
    }
  }
}

void render_devices(const PlacementOptions& placement, const std::vector<DeviceSpec>& devices,
                    std::ostream& out) {
  out << fmt::format("devices (policy {}, SMT {}): {}\n", runtime::to_string(placement.policy),
                     placement.use_smt ? "on" : "off", devices.size());
  std::vector<std::vector<std::string>> rows{{"#", "label", "cpuset", "threads", "node"}};
  for (const DeviceSpec& d : devices) {
    std::string node = "-";
    if (d.numa_node >= 0) {
      node = fmt::format("{} (P#{}{})", d.numa_node, d.numa_os_index,
                         d.whole_numa_node ? ", whole node" : "");
    }
    rows.push_back({fmt::format("{}", d.index), d.label, pus_text(d.cpuset),
                    fmt::format("{}", d.threads), node});
  }
  std::vector<std::size_t> width(rows.front().size(), 0);
  for (const auto& r : rows) {
    for (std::size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  for (const auto& r : rows) {
    std::string line = " ";
    for (std::size_t c = 0; c < r.size(); ++c) {
      line += fmt::format(" {:<{}}", r[c], c + 1 < r.size() ? width[c] + 1 : 0);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << "\n";
  }
}

void render_distances(const Topology& t, std::ostream& out) {
  const runtime::DistanceMatrix& d = t.distances();
  out << fmt::format("distances (origin {}):\n", d.origin);
  std::size_t width = fmt::format("{}", d.size).size();
  for (const std::uint64_t v : d.values) width = std::max(width, fmt::format("{}", v).size());
  std::string header = fmt::format("  {:>{}}", "", width);
  for (int j = 0; j < d.size; ++j) header += fmt::format(" {:>{}}", j, width);
  out << header << "\n";
  for (int i = 0; i < d.size; ++i) {
    std::string row = fmt::format("  {:>{}}", i, width);
    for (int j = 0; j < d.size; ++j) row += fmt::format(" {:>{}}", d.at(i, j), width);
    out << row << "\n";
  }
}

}  // namespace

CLI::App* add_topology_command(CLI::App& app, TopologyOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "topology",
      "Show the machine (or a synthetic or XML topology) as numesh sees it: packages, NUMA "
      "nodes, L3 groups and cores; the devices a placement policy makes; the NUMA distances; "
      "and what cannot be done (binding, restrictions).");
  cmd->footer(R"(Examples:
  numesh topology
  numesh topology --synthetic 'package:2 numa:2 core:8 pu:2' --policy l3 --smt
  numesh topology --xml machine.xml --json
)");
  add_machine_options(*cmd, o.machine, /*with_threads=*/false);
  cmd->add_flag("--json", o.json, "Print the report as JSON");
  return cmd;
}

void run_topology(const TopologyOptions& o, std::ostream& out) {
  // Checked before loading, so that a bad value is reported even when loading would fail too.
  const PlacementOptions placement = placement_options(o.machine);
  const Topology topology = load_topology(o.machine);
  std::vector<std::string> notes = topology.notes();
  const std::vector<DeviceSpec> devices = runtime::place_devices(topology, placement, &notes);
  if (o.json) {
    out << topology_json(topology, placement, devices, notes).dump(2) << "\n";
  } else {
    render_topology_text(topology, placement, devices, notes, out);
  }
}

json topology_json(const Topology& t, const PlacementOptions& placement,
                   const std::vector<DeviceSpec>& devices, const std::vector<std::string>& notes) {
  json j;
  j["source"] = std::string(runtime::to_string(t.source()));
  j["origin"] = t.origin();
  j["can_bind"] = t.can_bind();
  j["cpuset"] = t.cpuset().to_string();
  json packages = json::array();
  for (const runtime::Package& p : t.packages()) {
    packages.push_back(
        {{"index", p.index}, {"os_index", p.os_index}, {"cpuset", p.cpuset.to_string()}});
  }
  j["packages"] = packages;
  json nodes = json::array();
  for (const runtime::NumaNode& n : t.numa_nodes()) {
    nodes.push_back({{"index", n.index},
                     {"os_index", n.os_index},
                     {"cpuset", n.cpuset.to_string()},
                     {"memory_bytes", n.memory_bytes},
                     {"package", n.package}});
  }
  j["numa_nodes"] = nodes;
  json l3 = json::array();
  for (const runtime::CacheGroup& g : t.l3_groups()) {
    l3.push_back({{"index", g.index},
                  {"size_bytes", g.size_bytes},
                  {"cpuset", g.cpuset.to_string()},
                  {"numa_node", g.numa_node}});
  }
  j["l3_groups"] = l3;
  json cores = json::array();
  for (const runtime::Core& c : t.cores()) {
    cores.push_back({{"index", c.index},
                     {"pus", c.pus.to_string()},
                     {"numa_node", c.numa_node},
                     {"package", c.package},
                     {"l3_group", c.l3_group}});
  }
  j["cores"] = cores;
  j["policy"] = std::string(runtime::to_string(placement.policy));
  j["smt"] = placement.use_smt;
  json devs = json::array();
  for (const DeviceSpec& d : devices) {
    devs.push_back({{"index", d.index},
                    {"label", d.label},
                    {"cpuset", d.cpuset.to_string()},
                    {"threads", d.threads},
                    {"numa_node", d.numa_node},
                    {"numa_os_index", d.numa_os_index},
                    {"whole_numa_node", d.whole_numa_node}});
  }
  j["devices"] = devs;
  const runtime::DistanceMatrix& d = t.distances();
  json rows = json::array();
  for (int i = 0; i < d.size; ++i) {
    json row = json::array();
    for (int k = 0; k < d.size; ++k) row.push_back(d.at(i, k));
    rows.push_back(row);
  }
  j["distances"] = {{"origin", d.origin}, {"size", d.size}, {"values", rows}};
  j["notes"] = notes;
  j["kernels"] = {{"level", std::string(runtime::to_string(runtime::kernel_level()))},
                  {"cpu_features", runtime::cpu_features().text()}};
  return j;
}

void render_topology_text(const Topology& t, const PlacementOptions& placement,
                          const std::vector<DeviceSpec>& devices,
                          const std::vector<std::string>& notes, std::ostream& out) {
  out << fmt::format("topology: {}\n", source_text(t));
  out << fmt::format("binding:  {}\n", t.can_bind() ? "possible" : "not possible");
  out << fmt::format("PUs:      {} ({}, {}, {}, {}, {})\n", pus_text(t.cpuset()),
                     count_of(t.packages().size(), "package"),
                     count_of(t.numa_nodes().size(), "NUMA node"),
                     count_of(t.l3_groups().size(), "L3 group"), count_of(t.cores().size(), "core"),
                     count_of(t.cpuset().size(), "PU"));
  // The kernels numesh runs depend on this CPU (whatever topology is shown).
  out << fmt::format("kernels:  {} (this CPU: {}; NUMESH_KERNELS picks a narrower level)\n",
                     runtime::to_string(runtime::kernel_level()), runtime::cpu_features().text());
  const int blas_threads = ops::blas_threads();
  out << fmt::format(
      "openblas: core {}{}, {} thread{} of its own{}\n", ops::blas_core(), openblas_core_note(),
      blas_threads, blas_threads == 1 ? "" : "s",
      std::getenv("OPENBLAS_NUM_THREADS") != nullptr
          ? fmt::format(" (OPENBLAS_NUM_THREADS={})", std::getenv("OPENBLAS_NUM_THREADS"))
          : "");
  out << "\n";
  render_tree(t, out);
  out << "\n";
  render_devices(placement, devices, out);
  out << "\n";
  render_distances(t, out);
  if (!notes.empty()) {
    out << "\nnotes:\n";
    for (const std::string& n : notes) out << "  - " << n << "\n";
  }
}

}  // namespace numesh::tools
