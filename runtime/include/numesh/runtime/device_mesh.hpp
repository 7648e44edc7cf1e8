#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "numesh/runtime/device.hpp"
#include "numesh/sharding/mesh.hpp"

namespace numesh::runtime {

class Transport;      // transport.hpp
class SharedWindows;  // shared_windows.hpp

/// A named N-d mesh over the devices of a DeviceSet: the physical counterpart of
/// sharding::Mesh. Mesh slot i (row-major over the axes, as `np.arange(n).reshape(dims)`)
/// is device i of the set, which is what eformer's create_mesh does with CPU devices.
///
/// A mesh may span the ranks (processes) of a Transport: its slots are then every rank's
/// devices in rank order, and each slot belongs to one rank. This process's slots are *local*
/// and have a Device; the others are only known by their rank (docs/distributed.md). A mesh
/// made from a DeviceSet alone is all local: rank 0 of 1.
///
/// A cheap copyable handle (the devices are shared). Thread-safety: const methods are safe to
/// call concurrently.
class DeviceMesh {
 public:
  /// eformer's create_mesh over `devices`: `dims` are reshaped with numpy rules (one -1 takes
  /// the rest), `names` name the axes.
  /// Throws: ValueError when names and dims differ in length, a name repeats, two dims are -1,
  /// or the dims do not fit the device count (the message names the dims, the device count and
  /// the placement that made them).
  static DeviceMesh create(std::shared_ptr<DeviceSet> devices,
                           const std::vector<std::int64_t>& dims,
                           const std::vector<std::string>& names);

  /// A mesh over the devices of every rank of `transport`: `local` are this rank's, and the
  /// slots are rank 0's devices, then rank 1's, and so on. Collective: every rank calls it
  /// (with its own devices and the same dims and names), and it all-gathers the device counts.
  /// With one rank it is create(local, dims, names).
  /// Throws: ValueError as create (naming every rank's device count when the dims do not fit
  /// them all); ValueError when a rank has no device; what the transport's all_gather throws.
  /// The mesh keeps `transport`: collectives over it move other ranks' bytes through it, or,
  /// between ranks of one host, read them in place (SharedWindows::open, which this calls:
  /// when another rank shares this one's host, `local`'s devices allocate shared memory from
  /// then on).
  static DeviceMesh create(std::shared_ptr<DeviceSet> local, std::shared_ptr<Transport> transport,
                           const std::vector<std::int64_t>& dims,
                           const std::vector<std::string>& names);

  /// The logical mesh (axis names and sizes).
  const sharding::Mesh& mesh() const noexcept { return mesh_; }
  /// Number of mesh slots (= devices of every rank).
  std::int64_t size() const noexcept { return mesh_.size(); }
  /// This rank's devices (all of the mesh's in one process).
  DeviceSet& devices() const noexcept { return *devices_; }
  /// The shared device set of this rank.
  const std::shared_ptr<DeviceSet>& device_set() const noexcept { return devices_; }
  /// The device at mesh slot `slot`, which must be local.
  /// Throws: IndexError naming the slot and the mesh size; ValueError naming the slot, its rank
  /// and this rank's slots when the slot is another rank's.
  Device& device(std::int64_t slot) const;

  /// The transport between the mesh's ranks (a SingleProcessTransport for a mesh made from a
  /// DeviceSet alone). Never null.
  const std::shared_ptr<Transport>& transport() const noexcept { return transport_; }

  /// The shared memory between this rank and the other ranks of its host, through which
  /// collectives read their buffers in place; nullptr when none (one process, ranks on other
  /// hosts, NUMESH_SHARED_MEMORY=off).
  const std::shared_ptr<SharedWindows>& shared_windows() const noexcept { return windows_; }
  /// This process's rank (0 in one process).
  int this_rank() const noexcept { return this_rank_; }
  /// The number of ranks the mesh spans (1 in one process).
  int ranks() const noexcept { return static_cast<int>(first_slot_of_rank_.size()) - 1; }
  /// The rank holding `slot`. Throws: IndexError as device().
  int rank_of(std::int64_t slot) const;
  /// True when `slot` is this rank's. Throws: IndexError as device().
  bool is_local(std::int64_t slot) const { return rank_of(slot) == this_rank_; }
  /// This rank's slots, in order (every slot in one process).
  const std::vector<std::int64_t>& local_slots() const noexcept { return local_slots_; }
  /// Mesh coordinates of `slot`. Throws: IndexError.
  std::vector<std::int64_t> coords(std::int64_t slot) const;

  /// Device groups along `axes`: the slots that differ only in their coordinates on `axes`,
  /// one group per combination of the other axes' coordinates. Each group lists its slots in
  /// row-major order over `axes` *in mesh order* (so rank r of a group is its r-th slot);
  /// groups are ordered by their first slot. `axes` empty gives one group per slot.
  /// Example: mesh (dp=2, tp=2): groups({"tp"}) = {{0,1},{2,3}}, groups({"dp"}) =
  /// {{0,2},{1,3}}, groups({"dp","tp"}) = {{0,1,2,3}}.
  /// Throws: KeyError naming an axis the mesh lacks (and listing the mesh's axes);
  /// ValueError when an axis repeats.
  std::vector<std::vector<std::int64_t>> groups(std::span<const std::string> axes) const;

  /// "DeviceMesh('dp': 2, 'tp': 2) over 4 devices (numa policy)"; across ranks, "... over 4
  /// devices on 2 ranks (numa policy; this is rank 1, slots 2-3)".
  std::string to_string() const;

 private:
  // The mesh over `counts[r]` devices of each rank r; this rank's are `local`.
  static DeviceMesh over_ranks(std::shared_ptr<DeviceSet> local,
                               std::shared_ptr<Transport> transport, int this_rank,
                               const std::vector<std::int64_t>& counts,
                               const std::vector<std::int64_t>& dims,
                               const std::vector<std::string>& names);

  std::shared_ptr<DeviceSet> devices_;
  std::shared_ptr<Transport> transport_;
  std::shared_ptr<SharedWindows> windows_;
  sharding::Mesh mesh_;
  int this_rank_ = 0;
  // Rank r's slots are [first_slot_of_rank_[r], first_slot_of_rank_[r + 1]).
  std::vector<std::int64_t> first_slot_of_rank_{0, 0};
  std::vector<std::int64_t> local_slots_;
};

}  // namespace numesh::runtime
