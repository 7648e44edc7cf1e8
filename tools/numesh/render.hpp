#pragma once

// Presentation shared by the commands: a ShardLayout for `numesh resolve` (a block table in
// the manner of jax.debug.visualize_array_sharding, a per-device list, and the JSON form), a
// mesh's axes and byte counts as the reports print them.

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>

#include "numesh/core/units.hpp"
#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/shard_layout.hpp"

namespace numesh::tools {

using numesh::human_bytes;  // core/units.hpp

/// Writes the layout summary, the block table (rank 1 and 2: one cell per block listing the
/// devices that hold it) and one line per device (mesh coordinates, slice, replica group).
/// `itemsize` is the element size in bytes. Not thread-safe on the same stream.
void render_layout_text(const sharding::ShardLayout& layout, std::int64_t itemsize,
                        std::ostream& out);

/// The layout as JSON: blocks_per_dim, shard_shape, num_shards, replication, bytes_per_device,
/// replica_groups, and per device {device, coords, block, slices: [[start, stop], ...],
/// replica_group}. REQUIRES: itemsize > 0.
nlohmann::json layout_json(const sharding::ShardLayout& layout, std::int64_t itemsize);

/// "dp=2, ep=1, tp=4": a mesh's axes and sizes, as the run and op reports print them.
std::string axes_text(const sharding::Mesh& mesh);

/// A byte count exactly, in the largest binary unit that divides it: "4 KiB", "64 MiB",
/// "12 B" (`numesh bench collectives`' sizes; parse_bytes reads these back without the space).
std::string format_bytes(std::size_t bytes);

}  // namespace numesh::tools
