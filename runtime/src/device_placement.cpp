#include "numesh/runtime/device_placement.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <utility>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::runtime {

namespace {

// What a device is cut from: its full PUs and the cores they touch.
struct Slice {
  CpuSet pus;                      // every PU of the slice (SMT siblings included)
  std::vector<const Core*> cores;  // cores with a PU in the slice, in topology order
};

Slice slice_of(const Topology& topology, const CpuSet& pus) {
  Slice s{.pus = pus, .cores = {}};
  for (const Core& c : topology.cores()) {
    if (c.pus.intersects(pus)) s.cores.push_back(&c);
  }
  return s;
}

// One thread per core pinned to the core's first PU of the slice (no two threads share a
// core), or one thread per PU with SMT.
DeviceSpec make_device(const Topology& topology, const PlacementOptions& options, const Slice& s,
                       std::string label, int node) {
  DeviceSpec d;
  d.index = 0;  // numbered by the caller
  d.label = std::move(label);
  if (options.use_smt) {
    d.cpuset = s.pus;
  } else {
    std::vector<int> firsts;
    CpuSet in_cores;
    for (const Core* c : s.cores) {
      firsts.push_back(c->pus.intersect(s.pus).pus().front());
      in_cores = in_cores.unite(c->pus);
    }
    // A PU that no core holds (an export without Core objects under a node: found by
    // topology_fuzz, where such a node became a device of no thread) is a core of its own.
    for (const int pu : s.pus.pus()) {
      if (!in_cores.contains(pu)) firsts.push_back(pu);
    }
    d.cpuset = CpuSet(std::move(firsts));
  }
  d.threads = static_cast<int>(d.cpuset.size());
  if (options.max_threads_per_device > 0) {
    d.threads = std::min(d.threads, options.max_threads_per_device);
  }
  d.numa_node = node;
  if (node >= 0) {
    const NumaNode& n = topology.numa_nodes()[static_cast<std::size_t>(node)];
    d.numa_os_index = n.os_index;
    // Compared on full PUs, so the answer does not depend on the SMT mode.
    d.whole_numa_node = n.cpuset == s.pus;
  }
  return d;
}

// The node sharing the most PUs with `cpus` (the first on a tie), or -1.
int most_shared_node(const Topology& topology, const CpuSet& cpus) {
  int best = -1;
  std::size_t best_shared = 0;
  for (const NumaNode& n : topology.numa_nodes()) {
    const std::size_t shared = n.cpuset.intersect(cpus).size();
    if (shared > best_shared) {
      best = n.index;
      best_shared = shared;
    }
  }
  return best;
}

void add_note(std::vector<std::string>* notes, std::string note) {
  if (notes != nullptr) notes->push_back(std::move(note));
}

std::vector<DeviceSpec> place_numa(const Topology& topology, const PlacementOptions& options,
                                   std::vector<std::string>* notes) {
  std::vector<DeviceSpec> out;
  std::vector<std::string> memory_only;
  CpuSet covered;
  for (const NumaNode& n : topology.numa_nodes()) {
    if (n.cpuset.empty()) {
      memory_only.push_back(fmt::format("numa{}", n.os_index));
      continue;
    }
    covered = covered.unite(n.cpuset);
    out.push_back(make_device(topology, options, slice_of(topology, n.cpuset),
                              fmt::format("numa{}", n.os_index), n.index));
  }
  NUMESH_CHECK(!out.empty(), ValueError,
               "numa placement: none of the topology's {} NUMA nodes has a PU",
               topology.numa_nodes().size());
  if (!memory_only.empty()) {
    add_note(notes, fmt::format("NUMA nodes without PUs get no device (memory only): {}",
                                fmt::join(memory_only, ", ")));
  }
  // Happens on exports whose disallowed nodes were dropped with their PUs still listed
  // (16amd64-8n2c-cpusets.xml).
  const CpuSet orphans([&] {
    std::vector<int> v;
    for (const int pu : topology.cpuset().pus()) {
      if (!covered.contains(pu)) v.push_back(pu);
    }
    return v;
  }());
  if (!orphans.empty()) {
    add_note(notes, fmt::format("PUs {} belong to no NUMA node and get no device", orphans));
  }
  return out;
}

std::vector<DeviceSpec> place_l3(const Topology& topology, const PlacementOptions& options,
                                 std::vector<std::string>* notes) {
  std::vector<DeviceSpec> out;
  for (const CacheGroup& g : topology.l3_groups()) {
    if (g.cpuset.empty()) continue;  // an L3 left with only memory after restriction
    out.push_back(make_device(topology, options, slice_of(topology, g.cpuset),
                              fmt::format("l3-{}", g.index), g.numa_node));
  }
  if (out.empty()) {
    add_note(notes, "the topology reports no L3 cache: l3 placement falls back to numa");
    return place_numa(topology, options, notes);
  }
  return out;
}

std::vector<DeviceSpec> place_cores(const Topology& topology, const PlacementOptions& options) {
  std::vector<DeviceSpec> out;
  for (const Core& c : topology.cores()) {
    out.push_back(make_device(topology, options, Slice{.pus = c.pus, .cores = {&c}},
                              fmt::format("core{}", c.index), c.numa_node));
  }
  return out;
}

std::vector<DeviceSpec> place_explicit(const Topology& topology, const PlacementOptions& options) {
  const std::vector<CpuSet>& sets = options.explicit_cpusets;
  NUMESH_CHECK(!sets.empty(), ValueError,
               "explicit placement needs at least one cpuset (explicit_cpusets is empty)");
  for (std::size_t i = 0; i < sets.size(); ++i) {
    NUMESH_CHECK(!sets[i].empty(), ValueError, "explicit cpuset {} is empty", i);
    NUMESH_CHECK(topology.cpuset().contains(sets[i]), ValueError,
                 "explicit cpuset {} '{}' is outside the topology's PUs '{}'", i, sets[i],
                 topology.cpuset());
    for (std::size_t j = 0; j < i; ++j) {
      NUMESH_CHECK(!sets[j].intersects(sets[i]), ValueError,
                   "explicit cpusets {} '{}' and {} '{}' overlap (PUs {})", j, sets[j], i, sets[i],
                   sets[j].intersect(sets[i]));
    }
  }
  std::vector<DeviceSpec> out;
  for (const CpuSet& set : sets) {
    const Slice s = slice_of(topology, set);
    DeviceSpec d;
    d.label = fmt::format("cpus{}", set);
    // The caller chose the PUs; SMT only decides whether siblings count as extra threads.
    d.cpuset = set;
    d.threads = options.use_smt ? static_cast<int>(set.size()) : static_cast<int>(s.cores.size());
    if (options.max_threads_per_device > 0) {
      d.threads = std::min(d.threads, options.max_threads_per_device);
    }
    d.numa_node = most_shared_node(topology, set);
    if (d.numa_node >= 0) {
      const NumaNode& n = topology.numa_nodes()[static_cast<std::size_t>(d.numa_node)];
      d.numa_os_index = n.os_index;
      d.whole_numa_node = n.cpuset == set;
    }
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace

std::string_view to_string(PlacementPolicy policy) noexcept {
  switch (policy) {
    case PlacementPolicy::kNuma:
      return "numa";
    case PlacementPolicy::kL3:
      return "l3";
    case PlacementPolicy::kCore:
      return "core";
    case PlacementPolicy::kExplicit:
      return "explicit";
  }
  return "unknown";
}

PlacementPolicy parse_placement_policy(std::string_view text) {
  for (const PlacementPolicy p : {PlacementPolicy::kNuma, PlacementPolicy::kL3,
                                  PlacementPolicy::kCore, PlacementPolicy::kExplicit}) {
    if (text == to_string(p)) return p;
  }
  throw ValueError(
      fmt::format("unknown placement policy '{}' (choose numa, l3, core or explicit)", text));
}

std::vector<DeviceSpec> place_devices(const Topology& topology, const PlacementOptions& options,
                                      std::vector<std::string>* notes) {
  NUMESH_CHECK(!topology.cpuset().empty(), ValueError,
               "cannot place devices: the topology has no PU");
  NUMESH_CHECK(options.max_threads_per_device >= 0, ValueError,
               "max_threads_per_device {} is negative (0 means no cap)",
               options.max_threads_per_device);
  std::vector<DeviceSpec> out;
  switch (options.policy) {
    case PlacementPolicy::kNuma:
      out = place_numa(topology, options, notes);
      break;
    case PlacementPolicy::kL3:
      out = place_l3(topology, options, notes);
      break;
    case PlacementPolicy::kCore:
      out = place_cores(topology, options);
      break;
    case PlacementPolicy::kExplicit:
      out = place_explicit(topology, options);
      break;
  }
  for (std::size_t i = 0; i < out.size(); ++i) out[i].index = static_cast<int>(i);
  return out;
}

}  // namespace numesh::runtime
