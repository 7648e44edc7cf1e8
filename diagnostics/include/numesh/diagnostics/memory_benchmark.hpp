#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "numesh/runtime/device.hpp"

// Memory bandwidth and latency of the devices, measured the way numesh runs work: by each
// device's own threads, inside its oneTBB arena, on memory allocated for its NUMA node. This is
// the measurement behind `numesh bench memory` and the yardstick of memory-bound work (decode
// is judged against the read bandwidth measured in the same run).
//
// Kernels (STREAM's, on fp32 arrays of MemoryBenchmarkOptions::bytes each):
//   read   s += b[i]              counted as 1 x the array size
//   copy   a[i] = b[i]            counted as 2 x the array size
//   triad  a[i] = b[i] + q * c[i] counted as 3 x the array size
// Bytes are counted as STREAM counts them: each array read or written once per pass. All
// kernels use ordinary (cached) stores, so the hardware also reads each destination line
// before writing it (write-allocate). STREAM does not count that traffic, so the copy and
// triad rates are 2/3 and 3/4 of what the memory bus carries when every line is allocated.
// Rates are GB/s with GB = 1e9 bytes, from the median time of the timed passes.
//
// A pass with t threads is one tbb::parallel_for over t contiguous chunks with a static
// partitioner: one chunk per thread, every thread busy from start to end. oneTBB gives each
// chunk to a different arena slot; when fewer threads are free (more device threads than
// cores), chunks run one after another and the rate drops (observed_threads says how many
// threads really ran a pass) - it never hangs.

namespace numesh::diagnostics {

/// A bandwidth kernel.
enum class MemoryKernel {
  kRead,   ///< s += b[i]: a sum of floats, vectorized with independent accumulators
  kCopy,   ///< a[i] = b[i]
  kTriad,  ///< a[i] = b[i] + q * c[i]
};

/// "read", "copy" or "triad".
std::string_view to_string(MemoryKernel kernel) noexcept;
/// Parses "read", "copy" or "triad".
/// Throws: ValueError naming the text and listing the choices.
MemoryKernel parse_memory_kernel(std::string_view text);
/// The arrays one pass of `kernel` reads or writes (1, 2 or 3): STREAM's byte count of a pass
/// is this times the array size.
int stream_arrays(MemoryKernel kernel) noexcept;

/// Options of measure_device_bandwidth() and measure_node_matrix(). Every field has a default;
/// the defaults measure a real machine (seconds per device), tests set small sizes.
struct MemoryBenchmarkOptions {
  /// Bytes of each fp32 array (copy uses two arrays, triad three, all on the device's node).
  /// 512 MiB by default: far above any last-level cache, so the rates are DRAM rates.
  /// Must be a multiple of 64 (a cache line), from 4 KiB to 1 TiB (ValueError otherwise).
  std::size_t bytes = std::size_t{512} << 20;
  /// The kernels measure_device_bandwidth() runs, in this order (no duplicates, not empty).
  /// measure_node_matrix() always reads.
  std::vector<MemoryKernel> kernels = {MemoryKernel::kRead, MemoryKernel::kCopy,
                                       MemoryKernel::kTriad};
  /// Thread counts measure_device_bandwidth() sweeps, in this order ("bandwidth vs threads":
  /// {1, 2, 4, 8, 0}). 0 means all of the device's threads. Each must be in [0, the device's
  /// threads]; the list must not be empty or hold one value twice. Counts that resolve to the
  /// same number (0 and the device's threads) are measured once. measure_node_matrix() always
  /// reads with all of a device's threads.
  std::vector<int> threads = {0};
  /// Untimed passes before the timed ones (page-table and cache warm-up, waking the arena's
  /// workers). In [0, 1000].
  int warmup = 1;
  /// At least this many timed passes per measurement; the figure is their median. In
  /// [1, 100000].
  int repeats = 5;
  /// And keep timing until this many seconds of timed passes have run (0: repeats decides
  /// alone). Never more than 100000 passes. In [0, 3600].
  double min_seconds = 0.0;
  /// Bytes of the pointer-chasing list of the latency matrix, on the memory's node. Must be
  /// several times the last-level cache a reader sees, so that loads miss it: 256 MiB by
  /// default, 8 x the 32 MiB L3 of the project's machine kind and above the L3 of most server
  /// sockets. The list is one randomly permuted cycle over its cache lines, so loads also miss
  /// the TLB (4 KiB pages): the figure is the latency of a program's random accesses over that
  /// much memory (DRAM plus page walks), not the bare DRAM latency, and it grows with the size.
  /// Must be a multiple of 64, from 4 KiB to 64 GiB (ValueError otherwise).
  std::size_t latency_bytes = std::size_t{256} << 20;
  /// Dependent loads per timed latency pass (each pass continues the cycle where the previous
  /// one stopped, so it walks lines not touched recently). In [1, 1e10].
  std::uint64_t latency_loads = std::uint64_t{1} << 20;
  /// Called on the calling thread before each measurement with a one-line description
  /// ("device 0 (core0) triad 2 threads"), for a progress line; empty: nothing is called.
  std::function<void(const std::string&)> progress = {};
};

/// What a device's memory is and where it lies.
struct DeviceMemoryInfo {
  /// Device index in its DeviceSet.
  int device = 0;
  /// The device's label ("numa0", "core1").
  std::string label;
  /// NumaNode::index of the device's node, or -1 when its CPUs belong to none.
  int numa_node = -1;
  /// The device's threads (its arena's concurrency).
  int threads = 1;
  /// How the device's threads are pinned.
  runtime::Pinning pinning = runtime::Pinning::kUnpinned;
  /// How the device's memory is placed: DeviceBuffer::binding() of the first benchmark array
  /// (measure_device_bandwidth), or Device::memory_binding() (measure_node_matrix, whose rows
  /// allocate nothing of their own).
  runtime::MemoryBinding binding = runtime::MemoryBinding::kUnbound;
  /// Where the kernel says the first array's pages are (DeviceBuffer::query_node()): a node
  /// index, -1 when spread over several, nullopt when it cannot tell (unbindable topology) and
  /// in measure_node_matrix's rows (NodeMemoryInfo says where each column's pages are).
  std::optional<int> pages_on_node;
};

/// One (device, kernel, thread count) measurement.
struct BandwidthMeasurement {
  /// Device index in its DeviceSet.
  int device = 0;
  /// The kernel.
  MemoryKernel kernel = MemoryKernel::kRead;
  /// Threads the pass was split over (0 in the options resolved to the device's threads).
  int threads = 1;
  /// Fewest distinct arena threads that ran the chunks of one timed pass (== threads unless
  /// the machine is oversubscribed).
  int observed_threads = 1;
  /// Bytes of each array.
  std::size_t array_bytes = 0;
  /// STREAM's bytes of one pass: stream_arrays(kernel) * array_bytes.
  std::size_t counted_bytes = 0;
  /// Timed passes.
  int samples = 0;
  /// Median, fastest and slowest pass, in seconds.
  double median_seconds = 0.0;
  double min_seconds = 0.0;
  double max_seconds = 0.0;
  /// counted_bytes / median_seconds / 1e9: the figure to quote.
  double gbps = 0.0;
  /// counted_bytes / min_seconds / 1e9 (STREAM's "best rate").
  double best_gbps = 0.0;
};

/// The result of measure_device_bandwidth(). Plain values (copyable; concurrent const use is
/// safe); to_json() for reports.
struct DeviceBandwidthResult {
  /// Bytes of each array.
  std::size_t array_bytes = 0;
  /// The measured devices, in measurement order.
  std::vector<DeviceMemoryInfo> devices;
  /// Every measurement: by device, then kernel (options order), then threads (options order).
  std::vector<BandwidthMeasurement> measurements;

  /// The measurement of (device, kernel, threads), or nullptr when there is none. `threads` is
  /// the resolved count (not 0).
  const BandwidthMeasurement* find(int device, MemoryKernel kernel, int threads) const noexcept;
  /// {"array_bytes", "devices": [...], "measurements": [...], "units"}; optional values are
  /// null when absent. Keys are snake_case.
  nlohmann::json to_json() const;
};

/// Where the memory of one column (one NUMA node) of the node matrix came from.
struct NodeMemoryInfo {
  /// NumaNode::index.
  int node = 0;
  /// The operating system's node number.
  int os_index = 0;
  /// True when this node's column was measured. False only when the topology can bind but
  /// memory could be placed on the node neither by binding nor by a device's first touch;
  /// `note` says why and the column's values are nullopt. (Should only the latency list fail
  /// to be placed, the column is measured, its latencies are nullopt and `note` says so.)
  bool measured = false;
  /// How the buffers were placed: kBound (hwloc bound them to the node), kFirstTouch (a
  /// device pinned to the node wrote them first), kUnbound (nothing could be bound: the pages
  /// lie wherever the OS put them, so the column is not really this node's).
  runtime::MemoryBinding binding = runtime::MemoryBinding::kUnbound;
  /// The device whose allocator made the buffers (the first device on the node), or -1 when
  /// no device lives on it (memory-only nodes: bound directly with hwloc).
  int allocated_by_device = -1;
  /// Where the kernel says the read buffer's pages are (as DeviceMemoryInfo::pages_on_node).
  std::optional<int> pages_on_node;
  /// "" or one line saying what is not as the column's label claims (placed by first touch,
  /// unbound, pages found on another node, not measured).
  std::string note;
};

/// The result of measure_node_matrix(): rows are devices (readers), columns NUMA nodes
/// (where the memory is). Plain values (copyable; concurrent const use is safe); to_json() for
/// reports.
struct NodeMatrixResult {
  /// Bytes of the read buffer on each node.
  std::size_t bytes = 0;
  /// Bytes of the pointer-chasing list on each node.
  std::size_t latency_bytes = 0;
  /// Dependent loads per timed latency pass.
  std::uint64_t latency_loads = 0;
  /// The readers, one per row.
  std::vector<DeviceMemoryInfo> devices;
  /// The memory, one per column (every NUMA node of the topology, memory-only ones included).
  std::vector<NodeMemoryInfo> nodes;
  /// Row-major devices x nodes: GB/s of device i's threads reading node j's buffer (median,
  /// STREAM's count: 1 x bytes), nullopt for a column not measured.
  std::vector<std::optional<double>> read_gbps;
  /// Row-major devices x nodes: nanoseconds per dependent load of one of device i's threads
  /// chasing node j's list (median), nullopt for a column not measured.
  std::vector<std::optional<double>> latency_ns;

  /// Number of rows (devices).
  std::size_t rows() const noexcept { return devices.size(); }
  /// Number of columns (NUMA nodes).
  std::size_t cols() const noexcept { return nodes.size(); }
  /// read_gbps of (device row, node column). Throws: IndexError naming the pair and the shape.
  std::optional<double> read_gbps_at(std::size_t device, std::size_t node) const;
  /// latency_ns of (device row, node column). Throws: IndexError naming the pair and the shape.
  std::optional<double> latency_ns_at(std::size_t device, std::size_t node) const;
  /// {"bytes", "latency_bytes", "latency_loads", "devices", "nodes", "read_gbps": [[...]],
  /// "latency_ns": [[...]], "units"}; values not measured are null.
  nlohmann::json to_json() const;
};

/// Measures read, copy and triad bandwidth (options.kernels) of every device of `devices`, one
/// device after another, for each thread count of options.threads. For each device: the arrays
/// are allocated with Device::allocate (bound to its node, else placed by first touch; zero
/// filled by the device's own threads), filled by its threads, then each kernel runs
/// options.warmup untimed and at least options.repeats timed passes inside its arena. Every
/// result is checked (the read sum, every element copy and triad wrote); the arrays are freed
/// before the next device allocates.
/// Everything is validated before anything is allocated or measured.
/// Throws: ValueError naming the value for bad options (sizes not a multiple of 64 or out of
/// range, empty or duplicated kernels or threads, a thread count that is negative or above a
/// device's threads, repeats/warmup/min_seconds out of range), and naming the size, the device
/// and its node's memory when the arrays would not fit in the memory the topology reports for
/// the node (not checked when the node or its size is unknown); std::bad_alloc when memory
/// runs out anyway; Error when a kernel's result is wrong.
/// Thread-safety: runs work on the devices' arenas; do not run two measurements (or other
/// work) on the same devices at once if the figures are to mean anything.
DeviceBandwidthResult measure_device_bandwidth(const runtime::DeviceSet& devices,
                                               const MemoryBenchmarkOptions& options = {});

/// The same for device `device` of `devices` only.
/// Throws: IndexError when `device` is out of range; as above otherwise.
DeviceBandwidthResult measure_device_bandwidth(const runtime::DeviceSet& devices,
                                               std::size_t device,
                                               const MemoryBenchmarkOptions& options = {});

/// The NUMA matrix: for every device i (reader) and every NUMA node j of the topology (memory),
/// the read bandwidth of all of device i's threads over a buffer of options.bytes on node j,
/// and the latency of one of device i's threads chasing a randomly permuted cyclic list of
/// options.latency_bytes on node j. One node gives a devices x 1 matrix.
///
/// Node j's buffers come from the allocator of the first device on node j (Device::allocate:
/// bound, else first touch by that device's pinned threads); for a node without devices
/// (memory-only), from hwloc bound strictly to the node. When that is impossible the result
/// says so (NodeMemoryInfo::binding, note, pages_on_node) instead of labelling other memory
/// as node j's; a node whose memory cannot be placed at all on a bindable topology is not
/// measured. options.kernels and options.threads are not used.
/// Throws: ValueError naming the value for bad options (as measure_device_bandwidth, plus
/// latency_bytes and latency_loads), and naming the size, the node and its memory when a
/// buffer would not fit in what the topology reports for the node; std::bad_alloc; Error when
/// a read sum is wrong.
/// Thread-safety: as measure_device_bandwidth().
NodeMatrixResult measure_node_matrix(const runtime::DeviceSet& devices,
                                     const MemoryBenchmarkOptions& options = {});

}  // namespace numesh::diagnostics
