#pragma once

// One host value per mesh slot (a device's count, a partial sum) made whole on every rank. On a
// mesh over ranks each rank computes the values of its own slots; adding them in slot order
// after this gives every rank the sum one process gives, bit for bit.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/transport.hpp"

namespace numesh::runtime {

/// `per_slot` (one value per slot of `mesh`, this rank's slots filled) with every other rank's
/// slots filled from that rank. In one process it is `per_slot` as given. Collective over the
/// mesh's transport: every rank calls it, in the same order as its other collectives.
/// Throws: ValueError when `per_slot` does not have one value per slot; what the transport's
/// all_gather throws.
template <typename T>
std::vector<T> values_of_every_slot(const DeviceMesh& mesh, std::vector<T> per_slot) {
  static_assert(std::is_trivially_copyable_v<T>, "values cross ranks as bytes");
  NUMESH_CHECK(static_cast<std::int64_t>(per_slot.size()) == mesh.size(), ValueError,
               "values_of_every_slot: {} values for a mesh of {} slots", per_slot.size(),
               mesh.size());
  if (mesh.ranks() == 1) return per_slot;
  const std::size_t bytes = per_slot.size() * sizeof(T);
  std::vector<std::byte> all(bytes * static_cast<std::size_t>(mesh.ranks()));
  mesh.transport()->all_gather(std::as_bytes(std::span<const T>(per_slot)), all);
  for (std::int64_t slot = 0; slot < mesh.size(); ++slot) {
    const auto r = static_cast<std::size_t>(mesh.rank_of(slot));
    std::memcpy(&per_slot[static_cast<std::size_t>(slot)],
                all.data() + r * bytes + static_cast<std::size_t>(slot) * sizeof(T), sizeof(T));
  }
  return per_slot;
}

}  // namespace numesh::runtime
