#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "numesh/runtime/cpuset.hpp"

namespace numesh::runtime {

namespace detail {
class HwlocTopology;  // the loaded hwloc topology (runtime/src/hwloc_handle.hpp)
}  // namespace detail

/// Where a Topology came from.
enum class TopologySource {
  kMachine,    ///< the machine this process runs on (hwloc's native discovery)
  kSynthetic,  ///< an hwloc synthetic description such as "package:2 numa:2 core:8 pu:2"
  kXml,        ///< an hwloc XML export of some machine
};

/// "machine", "synthetic" or "xml".
std::string_view to_string(TopologySource source) noexcept;

/// A NUMA node: a memory domain and the PUs local to it.
struct NumaNode {
  /// Position among the topology's NUMA nodes (0..n-1, hwloc's logical index), the index
  /// devices and the distance matrix use.
  int index = 0;
  /// The operating system's node number (what numactl and oneTBB's numa ids call it).
  int os_index = 0;
  /// PUs local to the node (after restriction to the process binding). May be empty: some
  /// machines have memory-only nodes.
  CpuSet cpuset;
  /// Local memory in bytes as hwloc reports it (on VMs this can disagree with /proc/meminfo).
  std::uint64_t memory_bytes = 0;
  /// Index of the package (socket) holding the node, or -1 when it has none: the package
  /// hwloc attaches the node under or, when hwloc attaches it above the packages (to a Group),
  /// the package whose PUs include the node's.
  int package = -1;
};

/// A package (socket).
struct Package {
  /// Position among the topology's packages.
  int index = 0;
  /// The operating system's package number.
  int os_index = 0;
  /// PUs of the package.
  CpuSet cpuset;
};

/// A group of cores sharing a last-level (L3) cache.
struct CacheGroup {
  /// Position among the topology's L3 groups.
  int index = 0;
  /// Cache size in bytes (0 when unknown).
  std::uint64_t size_bytes = 0;
  /// PUs sharing the cache.
  CpuSet cpuset;
  /// Index of the NUMA node holding these PUs (the one sharing the most PUs), or -1.
  int numa_node = -1;
};

/// A physical core.
struct Core {
  /// Position among the topology's cores.
  int index = 0;
  /// Its PUs (more than one with SMT). Never empty.
  CpuSet pus;
  /// Index of the NUMA node holding the core, or -1 when none does.
  int numa_node = -1;
  /// Index of the package holding the core, or -1.
  int package = -1;
  /// Index of the L3 group holding the core, or -1 when the topology has no L3.
  int l3_group = -1;
};

/// The NUMA distance matrix: relative memory access cost from node i to node j, in the ACPI
/// SLIT convention (10 = local).
struct DistanceMatrix {
  /// Number of nodes (rows and columns).
  int size = 0;
  /// Row-major size * size values, indexed by NumaNode::index.
  std::vector<std::uint64_t> values;
  /// Where the values come from: "os" (hwloc read the machine's table), "xml" (from the file),
  /// "synthetic" (from the synthetic description), or "default" (none available: 10 on the
  /// diagonal, 20 elsewhere, clearly a guess; a note says so when there are several nodes).
  std::string origin;
  /// The value for (from, to). REQUIRES: both in [0, size).
  std::uint64_t at(int from, int to) const noexcept {
    return values[static_cast<std::size_t>(from * size + to)];
  }
};

/// A machine's layout as numesh sees it: NUMA nodes, packages, L3 groups, cores and PUs, and
/// the distances between nodes. Loaded through hwloc from the running machine, a synthetic
/// description or an XML file.
///
/// The machine topology honours the process's own CPU binding (taskset, numactl, cgroups of
/// containers): PUs the process may not run on are left out of every cpuset, and a note says
/// so. Loading the machine topology also checks /proc/sys/kernel/numa_balancing and warns once
/// per process when the kernel's automatic NUMA balancing is on (it migrates pages behind the
/// runtime's placement).
///
/// Binding threads and memory is only meaningful on the machine topology; for synthetic and
/// XML topologies can_bind() is false and devices made from them run unpinned. The exception
/// is a synthetic topology loaded with HWLOC_THISSYSTEM=1 in the environment: hwloc then
/// treats it as this system, and binding to the CPUs it names really happens. That is how two
/// NUMA devices are emulated on a one-node machine of two CPUs: with
/// HWLOC_SYNTHETIC='numa:2 core:1 pu:1', hwloc and oneTBB's tbbbind see two nodes of one CPU
/// each and pin their threads to CPU 0 and CPU 1, while binding memory to the fake node 1 fails
/// and falls back to first touch (docs/runtime.md, section 10).
///
/// A Topology is an immutable value that shares its loaded hwloc topology between copies.
/// Thread-safety: all methods are safe to call concurrently.
class Topology {
 public:
  /// The running machine. Throws: TopologyError when hwloc fails to load it.
  static Topology discover();
  /// An hwloc synthetic description, e.g. "package:2 numa:2 core:8 pu:2".
  /// Throws: TopologyError naming the description when hwloc rejects it.
  static Topology from_synthetic(std::string_view description);
  /// An hwloc XML export (`lstopo --of xml`).
  /// Throws: TopologyError naming the file when it is missing or hwloc cannot parse it.
  static Topology from_xml(const std::filesystem::path& file);

  /// Where the topology came from.
  TopologySource source() const noexcept { return source_; }
  /// The synthetic description or XML path it was loaded from; "" for the machine.
  const std::string& origin() const noexcept { return origin_; }
  /// True when threads and memory can really be bound on this topology (see the class notes).
  /// Binding code must test this, not hwloc's is_thissystem: an XML topology never binds.
  bool can_bind() const noexcept { return can_bind_; }

  /// NUMA nodes in hwloc's logical order.
  const std::vector<NumaNode>& numa_nodes() const noexcept { return numa_nodes_; }
  /// Packages in hwloc's logical order.
  const std::vector<Package>& packages() const noexcept { return packages_; }
  /// L3 groups in hwloc's logical order (empty when the topology reports no L3).
  const std::vector<CacheGroup>& l3_groups() const noexcept { return l3_groups_; }
  /// Cores in hwloc's logical order (each PU is a core when the topology has no Core level).
  const std::vector<Core>& cores() const noexcept { return cores_; }
  /// Every PU the process may use (the union of the cores' PUs).
  const CpuSet& cpuset() const noexcept { return cpuset_; }
  /// The NUMA distance matrix (origin "default" when neither the OS nor the file had one).
  const DistanceMatrix& distances() const noexcept { return distances_; }
  /// Human-readable notes about what this topology cannot do or how it was restricted
  /// (e.g. "restricted to the process binding 0-3", "binding is not possible on an XML
  /// topology"), in the order found.
  const std::vector<std::string>& notes() const noexcept { return notes_; }

  /// The loaded hwloc topology, for the runtime's own binding and allocation code.
  /// Not part of the public API: detail::HwlocTopology is defined in runtime/src.
  const std::shared_ptr<const detail::HwlocTopology>& hwloc() const noexcept { return hwloc_; }

 private:
  Topology() = default;
  friend class detail::HwlocTopology;

  TopologySource source_ = TopologySource::kMachine;
  std::string origin_;
  bool can_bind_ = false;
  std::vector<NumaNode> numa_nodes_;
  std::vector<Package> packages_;
  std::vector<CacheGroup> l3_groups_;
  std::vector<Core> cores_;
  CpuSet cpuset_;
  DistanceMatrix distances_;
  std::vector<std::string> notes_;
  std::shared_ptr<const detail::HwlocTopology> hwloc_;
};

}  // namespace numesh::runtime
