#pragma once

#include <oneapi/tbb/task_arena.h>
#include <oneapi/tbb/task_scheduler_observer.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "numesh/runtime/device_buffer.hpp"
#include "numesh/runtime/device_placement.hpp"
#include "numesh/runtime/topology.hpp"

namespace numesh::runtime {

class HugePageSlabs;

/// How a device's threads are kept on its cpuset.
enum class Pinning {
  kNumaConstraints,  ///< oneTBB's NUMA arena constraints (tbbbind) pin to the whole node
  kObserver,         ///< numesh's arena observer binds each entering thread with hwloc
  kUnpinned,         ///< the topology cannot bind (synthetic, XML): threads float freely
};

/// "numa-constraints", "observer" or "unpinned".
std::string_view to_string(Pinning pinning) noexcept;

/// What a new DeviceBuffer holds.
enum class BufferContents : std::uint8_t {
  kZeros,        ///< every byte 0
  kUnspecified,  ///< anything: the owner overwrites every byte before reading one
};

/// One compute device: a set of cores, the oneTBB arena whose threads run on them, and the
/// NUMA node whose memory it allocates. Devices are made by DeviceSet::create() and shared
/// (std::shared_ptr) by everything that uses them; they are neither copyable nor movable.
///
/// The arena reserves no slot for external threads: every slot is a worker, so work submitted
/// from outside (a graph run, execute()) always finds threads. Thread-safety: all methods are
/// safe to call concurrently.
class Device : public std::enable_shared_from_this<Device> {
 public:
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  ~Device();

  /// The device index in its DeviceSet.
  int index() const noexcept { return spec_.index; }
  /// What the placement made: label, cpuset, threads, node.
  const DeviceSpec& spec() const noexcept { return spec_; }
  /// The arena whose threads run this device's work.
  oneapi::tbb::task_arena& arena() noexcept { return arena_; }
  /// How the threads are pinned.
  Pinning pinning() const noexcept { return pinning_; }
  /// How memory is placed: kBound when hwloc can bind to the node (checked once at creation
  /// with a probe allocation), kFirstTouch when only first touch from pinned threads can place
  /// it, kUnbound when the device is unpinned.
  MemoryBinding memory_binding() const noexcept { return memory_binding_; }
  /// One line on what binding the machine could not do for this device ("" when nothing).
  const std::string& binding_note() const noexcept { return binding_note_; }

  /// Runs `f` in the device's arena (on a thread pinned to the device) and returns its result;
  /// an exception from `f` propagates. The calling thread joins the arena if a slot is free,
  /// else it waits (blocking, not spinning) while a device thread runs `f`.
  template <typename F>
  decltype(auto) execute(F&& f) {
    return arena_.execute(std::forward<F>(f));
  }

  /// Allocates `bytes` (> 0) for this device: bound to its node when possible (else placed by
  /// first touch), carved from the device's huge-page slabs (huge_page_slabs.hpp; a buffer of
  /// its own when huge_page_slabs_enabled() is false or a slab cannot be mapped), zero-filled
  /// by the device's threads; with BufferContents::kUnspecified not filled at all (the caller
  /// writes every byte before anything reads one, from the device's threads, whose first touch
  /// then places the pages: a model's weights, filled from their checkpoint, skip a pass over
  /// their memory).
  /// Throws: ValueError for 0 bytes, and before allocating when `bytes` and the live buffers
  /// the set's devices already hold on the same NUMA node exceed that node's memory as the
  /// topology reports it (naming the size, the device, the node's memory and what numesh's
  /// buffers take of it; not checked when the topology does not report it, as synthetic ones
  /// do); std::bad_alloc when memory is exhausted all the same (the node's memory is shared
  /// with everything else on the machine).
  DeviceBuffer allocate(std::size_t bytes, BufferContents contents = BufferContents::kZeros);

  /// A buffer over `size` bytes from `bytes` that this device reads in place instead of a copy
  /// of its own (a model file's mapping: no allocation, no copy, no page of the device's node).
  /// The buffer keeps `bytes` alive until it is released and never writes them; its binding()
  /// is kMapped and it is not counted against the node's memory (the pages are the owner's).
  /// Throws: ValueError when `bytes` is null or `size` is 0.
  DeviceBuffer use_mapped(std::shared_ptr<const std::byte> bytes, std::size_t size);

  /// From now on, allocate() takes blocks of `min_bytes` or more from `arena` (memory the
  /// host's other processes can map) while it has room, bound to the device's node as before,
  /// and smaller ones, or any when the arena is full, from the device's private memory. Set by a
  /// mesh that spans ranks of one host (SharedWindows), once: a later call keeps the first arena
  /// and floor. Buffers allocated before stay where they are. Why a floor: the windows read no
  /// transfer smaller than theirs in place (SharedWindows::in_place_min_bytes), so a smaller
  /// buffer gains nothing from shared memory, and private memory has huge pages where shared
  /// memory often has not (a 256-token prefill across two ranks: 605-708 ms against 696-728).
  void share_memory(std::shared_ptr<SharedArena> arena, std::size_t min_bytes = 0);
  /// The arena allocate() takes blocks from, or nullptr.
  [[nodiscard]] std::shared_ptr<SharedArena> shared_arena() const;

 private:
  friend class DeviceSet;
  class PinningObserver;
  Device(std::shared_ptr<const Topology> topology, DeviceSpec spec);
  // The count of live buffer bytes on this device's node (shared by the set's devices on that
  // node), or null when the node's memory is unknown and nothing is counted.
  std::atomic<std::uint64_t>* node_bytes_in_use() const noexcept;
  // Per NUMA node of the topology, the bytes of the live buffers the set's devices hold there.
  struct NodeUsage {
    explicit NodeUsage(std::size_t nodes) : bytes(nodes) {}
    std::vector<std::atomic<std::uint64_t>> bytes;
  };

  std::shared_ptr<const Topology> topology_;
  DeviceSpec spec_;
  Pinning pinning_ = Pinning::kUnpinned;
  MemoryBinding memory_binding_ = MemoryBinding::kUnbound;
  std::string binding_note_;
  oneapi::tbb::task_arena arena_;
  std::unique_ptr<PinningObserver> observer_;
  std::shared_ptr<NodeUsage> node_usage_;
  mutable std::mutex shared_arena_mutex_;
  std::shared_ptr<SharedArena> shared_arena_;
  std::size_t shared_min_bytes_ = 0;  // share_memory's floor
  // Where allocate() carves private buffers (null when huge_page_slabs_enabled() is false).
  std::unique_ptr<HugePageSlabs> slabs_;
  friend class DeviceBuffer;
};

/// The devices a placement policy makes of a topology, each with its arena and allocator.
///
/// While a DeviceSet lives, oneTBB's worker limit is at least its device threads plus one, so
/// that every device's arena can be fully staffed at once (oneTBB's default is the machine's
/// concurrency, too few when devices together have more threads, e.g. on synthetic
/// topologies). numesh keeps one tbb::global_control for all live sets, at the largest limit
/// any of them needs. A smaller max_allowed_parallelism set by the program itself still wins
/// (oneTBB takes the minimum of all controls), and then devices share fewer threads: slower,
/// never stuck, since nothing waits for a thread that is not there.
/// Binding the machine cannot do degrades to unpinned devices with one warning per process.
/// Thread-safety: all methods are safe to call concurrently.
class DeviceSet {
 public:
  /// Releases this set's claim on the worker limit.
  ~DeviceSet();
  DeviceSet(const DeviceSet&) = delete;
  DeviceSet& operator=(const DeviceSet&) = delete;

  /// Places devices on `topology` by `options` (see place_devices()) and creates them.
  /// Throws: ValueError from place_devices().
  static std::shared_ptr<DeviceSet> create(Topology topology, const PlacementOptions& options = {});

  /// The topology the devices come from.
  const Topology& topology() const noexcept { return *topology_; }
  /// The options they were placed with.
  const PlacementOptions& options() const noexcept { return options_; }
  /// Number of devices.
  std::size_t size() const noexcept { return devices_.size(); }
  /// Device `index`. Throws: IndexError naming the index and the device count.
  Device& device(std::size_t index) const;
  /// Shared handle to device `index`. Throws: IndexError.
  std::shared_ptr<Device> device_ptr(std::size_t index) const;
  /// Total threads over all devices.
  int total_threads() const noexcept;
  /// Notes from placement and binding (memory-only nodes skipped, unpinned devices, ...).
  const std::vector<std::string>& notes() const noexcept { return notes_; }

 private:
  DeviceSet() = default;
  std::shared_ptr<const Topology> topology_;
  PlacementOptions options_;
  std::vector<std::shared_ptr<Device>> devices_;
  std::vector<std::string> notes_;
  std::size_t worker_limit_ = 0;  // what this set asked of the shared worker limit (0: nothing)
};

}  // namespace numesh::runtime
