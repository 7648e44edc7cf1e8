#pragma once

// What `numesh bench memory` and `numesh bench decode` share: the checks of their array sizes
// against the memory of the NUMA nodes (named in every message), the machine as their reports and
// JSON files describe it, the progress line on stderr and the --json file, opened before anything
// is measured.

#include <cstddef>
#include <fstream>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "numesh/core/progress_line.hpp"
#include "numesh/runtime/device.hpp"

namespace numesh::tools {

/// Checks that `arrays` x `bytes` fit in the memory hwloc reports for each device's NUMA node
/// (nodes of unknown size, and devices without a node, are not checked); `what` says what the
/// arrays are for ("triad needs 3 arrays"), `option` names the option that sized them.
/// The message reads "{option} {bytes}: {what} of that size ({arrays x bytes}) on NUMA node
/// {n} of device {i} ({label}), which has {memory} ...".
/// Throws: ValueError naming the option, the size, the node, its memory and the device.
void check_device_nodes_fit(const runtime::DeviceSet& devices, std::string_view option,
                            std::size_t bytes, int arrays, std::string_view what);

/// Checks that `bytes` fit in the memory hwloc reports for every NUMA node of the topology
/// (the node matrix places one buffer on each).
/// Throws: ValueError naming the option, the size, the node and its memory.
void check_all_nodes_fit(const runtime::DeviceSet& devices, std::string_view option,
                         std::size_t bytes);

/// The machine as the bench JSON files record it: the topology (source, origin, can_bind,
/// NUMA nodes with their memory), the placement (policy, smt, max_threads) and the devices
/// (index, label, cpuset, threads, numa_node, pinning, memory_binding), and the device set's
/// notes.
nlohmann::json machine_json(const runtime::DeviceSet& devices);

/// One line per device for the report header: "  device 0 core0: cpus 0, 1 thread, NUMA node
/// 0, pinned (observer), memory bound", then the device set's notes as "note: ..." lines.
void write_devices_text(const runtime::DeviceSet& devices, std::ostream& out);

/// Opens --json FILE for writing before anything is measured, so that an unwritable path is
/// reported first. An empty path gives a closed stream (nothing to write).
/// Throws: IoError "cannot write --json file '{path}'".
std::ofstream open_json_file(const std::string& path);

}  // namespace numesh::tools
