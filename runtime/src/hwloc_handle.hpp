#pragma once

// The runtime's only window on hwloc: RAII owners of hwloc topologies and bitmaps, conversions
// between hwloc bitmaps and CpuSet, and HwlocTopology, the loaded topology a Topology shares
// between its copies. Private to runtime/src: no public header includes hwloc.h.

#include <hwloc.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "numesh/runtime/cpuset.hpp"
#include "numesh/runtime/topology.hpp"

namespace numesh::runtime::detail {

/// Deleter of an owned hwloc topology (hwloc_topology_destroy).
struct TopologyDeleter {
  void operator()(hwloc_topology_t topology) const noexcept { hwloc_topology_destroy(topology); }
};
/// An owned hwloc topology (hwloc_topology_t is `struct hwloc_topology*`).
using UniqueTopology = std::unique_ptr<hwloc_topology, TopologyDeleter>;

/// Deleter of an owned hwloc bitmap (hwloc_bitmap_free).
struct BitmapDeleter {
  void operator()(hwloc_bitmap_t bitmap) const noexcept { hwloc_bitmap_free(bitmap); }
};
/// An owned hwloc bitmap (cpuset or nodeset; hwloc_bitmap_t is `struct hwloc_bitmap_s*`).
using UniqueBitmap = std::unique_ptr<hwloc_bitmap_s, BitmapDeleter>;

/// A new, empty hwloc bitmap. Throws: TopologyError when hwloc cannot allocate it.
UniqueBitmap make_bitmap();

/// The hwloc bitmap holding the PUs of `cpus` (OS indexes). Throws: TopologyError when hwloc
/// cannot allocate it.
UniqueBitmap to_bitmap(const CpuSet& cpus);

/// The NUMA node (NumaNode::index of `topology`) holding the pages of [p, p + bytes): -1 when
/// they are spread over several nodes (or on one numesh does not know), nullopt when the
/// topology cannot bind or hwloc cannot tell (pages not touched yet, a synthetic machine).
std::optional<int> pages_node(const Topology& topology, const void* p, std::size_t bytes);

/// The PUs of an hwloc cpuset (OS indexes). REQUIRES: `bitmap` is finite (hwloc's cpusets of
/// objects always are). A null bitmap gives the empty set.
CpuSet to_cpuset(hwloc_const_bitmap_t bitmap);

/// A loaded hwloc topology, owned and shared by the Topology values made from it.
///
/// The topology is never modified after construction, and hwloc's query and binding functions
/// on an unmodified loaded topology are thread-safe, so every method here may be called
/// concurrently (hwloc docs, "Thread safety").
///
/// Usage from the runtime's binding code (device.cpp):
///   const auto& hw = *topology.hwloc();
///   hwloc_set_cpubind(hw.get(), to_bitmap(device.cpuset).get(), HWLOC_CPUBIND_THREAD);
///   hwloc_alloc_membind(hw.get(), bytes, hw.numa_obj(device.numa_node)->nodeset,
///                       HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_BYNODESET);
class HwlocTopology {
 public:
  /// Takes ownership of a loaded topology. REQUIRES: `topology` is loaded (and, for the machine,
  /// already restricted to the process binding).
  explicit HwlocTopology(UniqueTopology topology) noexcept : topology_(std::move(topology)) {}

  /// The hwloc handle, for hwloc calls that do not modify the topology.
  hwloc_topology_t get() const noexcept { return topology_.get(); }

  /// The hwloc object of the NUMA node whose NumaNode::index is `index` (NumaNode::index is the
  /// node's hwloc logical index), or nullptr when there is none. Its `nodeset` is what memory
  /// binding takes; its `cpuset` is the node's locality.
  hwloc_obj_t numa_obj(int index) const noexcept;

  /// True when binding through this topology acts on the running machine: the machine
  /// topology, or a synthetic one loaded with HWLOC_THISSYSTEM=1. hwloc's XML and synthetic
  /// backends otherwise install binding hooks that do nothing and report success.
  bool is_thissystem() const noexcept { return hwloc_topology_is_thissystem(get()) != 0; }

  /// Reads the Topology value out of `hwloc` (defined in topology.cpp). Used by Topology's
  /// factories only; the source decides the distance origin and the notes it adds to `notes`.
  /// Throws: TopologyError when an hwloc query fails.
  static Topology make_topology(std::shared_ptr<const HwlocTopology> hwloc, TopologySource source,
                                std::string origin, bool can_bind, std::vector<std::string> notes);

 private:
  UniqueTopology topology_;
};

}  // namespace numesh::runtime::detail
