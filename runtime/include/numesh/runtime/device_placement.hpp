#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "numesh/runtime/cpuset.hpp"
#include "numesh/runtime/topology.hpp"

namespace numesh::runtime {

/// How a topology is cut into devices.
enum class PlacementPolicy {
  kNuma,      ///< one device per NUMA node that has PUs (the default)
  kL3,        ///< one device per L3 group
  kCore,      ///< one device per core
  kExplicit,  ///< one device per cpuset the caller lists
};

/// "numa", "l3", "core" or "explicit".
std::string_view to_string(PlacementPolicy policy) noexcept;
/// Parses "numa", "l3", "core" or "explicit".
/// Throws: ValueError naming the text and listing the choices.
PlacementPolicy parse_placement_policy(std::string_view text);

/// Options of place_devices(). Every field has a default.
struct PlacementOptions {
  /// How to cut the topology.
  PlacementPolicy policy = PlacementPolicy::kNuma;
  /// true: one thread per PU (SMT siblings included); false: one thread per core, pinned to
  /// the core's first PU, so that no two threads of a device share a core.
  bool use_smt = false;
  /// For kExplicit: the devices' cpusets, in device order. Ignored otherwise.
  std::vector<CpuSet> explicit_cpusets = {};
  /// Caps each device's thread count (0 = no cap). Useful for synthetic topologies with more
  /// cores than the machine has.
  int max_threads_per_device = 0;
};

/// A device-to-be: where its threads may run, how many there are, and whose memory it uses.
struct DeviceSpec {
  /// Device index (0..n-1), in topology order.
  int index = 0;
  /// Short label: "numa0", "l3-2", "core5", "cpus0-3".
  std::string label;
  /// PUs the device's threads are pinned to.
  CpuSet cpuset;
  /// Number of threads (the device's arena concurrency), >= 1.
  int threads = 1;
  /// NumaNode::index of the node whose memory the device uses, or -1 when no node holds its
  /// PUs (then memory is not bound).
  int numa_node = -1;
  /// The OS number of that node (oneTBB's numa id), or -1.
  int numa_os_index = -1;
  /// True when the device is exactly one whole NUMA node (oneTBB's NUMA constraints apply).
  bool whole_numa_node = false;

  friend bool operator==(const DeviceSpec&, const DeviceSpec&) = default;
};

/// Cuts `topology` into devices by `options`.
/// - kNuma: NUMA nodes without PUs are skipped (memory-only nodes), with a note in
///   `notes` when given; so are PUs that belong to no NUMA node, with a note.
/// - kL3, kCore: a device's node is the one sharing most of its PUs; whole_numa_node is true
///   when the device's PUs (SMT siblings included) are exactly that node's.
/// - kL3 on a topology without L3 caches falls back to kNuma, with a note.
/// - kExplicit: each cpuset must be non-empty and inside the topology's cpuset, and no two may
///   overlap; a device's node is the node holding the most of its PUs.
/// - Devices are numbered 0..n-1 in topology order (kExplicit: in list order).
/// Throws: ValueError when the topology has no PU, max_threads_per_device is negative, an
/// explicit list is empty, a cpuset is empty, outside the topology or overlaps another
/// (naming the cpusets).
/// Thread-safe (reads `topology` only).
std::vector<DeviceSpec> place_devices(const Topology& topology, const PlacementOptions& options,
                                      std::vector<std::string>* notes = nullptr);

}  // namespace numesh::runtime
