// Memory bandwidth and latency of the devices (memory_benchmark.hpp): STREAM's read, copy and
// triad run by each device's threads in its arena, and the device x node read and latency
// matrix.

#include "numesh/diagnostics/memory_benchmark.hpp"

#include <fmt/format.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <utility>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/units.hpp"
#include "numesh/runtime/node_memory.hpp"

namespace numesh::diagnostics {

using namespace numesh::runtime;  // the runtime is what this library measures

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

constexpr std::size_t kLine = 64;
constexpr std::size_t kFloatsPerLine = kLine / sizeof(float);
constexpr std::size_t kMinBytes = 4096;
constexpr std::size_t kMaxBytes = std::size_t{1} << 40;
constexpr std::size_t kMaxLatencyBytes = std::size_t{64} << 30;
constexpr std::uint64_t kMaxLatencyLoads = 10'000'000'000;
constexpr int kMaxWarmup = 1000;
constexpr int kMaxRepeats = 100000;
constexpr double kMaxMinSeconds = 3600.0;
// Timed passes of one measurement stop here even when min_seconds has not been reached.
constexpr std::size_t kMaxSamples = 100000;

// The arrays hold b = 1, c = 2, and triad's scalar is 3, so that every result is exact in fp32
// (copy gives 1, triad 7, a read of n ones sums to n) and can be checked exactly.
constexpr float kBValue = 1.0f;
constexpr float kCValue = 2.0f;
constexpr float kScalar = 3.0f;
constexpr float kTriadValue = kBValue + kScalar * kCValue;

// ---------------------------------------------------------------------------------------------
// Kernels. Plain loops the compiler vectorizes (checked in the generated code with GCC 12,
// -O3 -march=native on Zen 4: 4 zmm accumulators for read, zmm loads and ordinary stores for
// copy, zmm FMAs and ordinary stores for triad).

// The read sum keeps 64 independent float lanes: the compiler holds them in several vector
// registers (4 AVX-512 or 8 AVX2), so consecutive adds do not wait on each other and the loop
// runs at load speed. One accumulator would be bound by the add latency (one vector per ~3
// cycles), which is below what one core can stream from L3. Without -ffast-math the compiler
// may not reassociate a plain `s += b[i]` itself, hence the explicit lanes.
constexpr std::size_t kLanes = 64;
// The lanes are flushed into a double every kReadBlock floats, so a sum of ones stays exact
// for any array size (a float lane is exact up to 2^24).
constexpr std::size_t kReadBlock = std::size_t{1} << 16;

double read_kernel(const float* __restrict b, std::size_t n) noexcept {
  double total = 0.0;
  std::size_t i = 0;
  while (n - i >= kLanes) {
    const std::size_t end = i + std::min(kReadBlock, (n - i) / kLanes * kLanes);
    float acc[kLanes] = {};
    for (; i < end; i += kLanes) {
      for (std::size_t k = 0; k < kLanes; ++k) acc[k] += b[i + k];
    }
    for (std::size_t k = 0; k < kLanes; ++k) total += static_cast<double>(acc[k]);
  }
  for (; i < n; ++i) total += static_cast<double>(b[i]);
  return total;
}

// GCC and Clang turn a plain `a[i] = b[i]` loop into a memcpy (or, once inlined where the
// pointers may alias, memmove) call, and glibc's memcpy switches to non-temporal stores above
// a size that depends on the cache and the glibc version; the benchmark promises ordinary
// stores for all three kernels. So the copy goes in blocks of kLanes floats (4 zmm loads and
// stores with AVX-512) with an empty asm memory clobber after each block (what Google
// Benchmark's ClobberMemory does): it costs no instruction but stops the compilers from
// seeing a whole-array copy. Checked in the generated code of GCC 12 and Clang 14, inlined.
void copy_kernel(float* __restrict a, const float* __restrict b, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; n - i >= kLanes; i += kLanes) {
    for (std::size_t k = 0; k < kLanes; ++k) a[i + k] = b[i + k];
    __asm__ __volatile__("" : : : "memory");
  }
  for (; i < n; ++i) a[i] = b[i];  // under 64 floats: a memcpy call is fine here
}

void triad_kernel(float* __restrict a, const float* __restrict b, const float* __restrict c,
                  float q, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) a[i] = b[i] + q * c[i];
}

void fill_kernel(float* a, float value, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) a[i] = value;
}

// Elements of a[0, n) that are not `value`.
double count_not_equal(const float* a, float value, std::size_t n) noexcept {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += a[i] != value ? 1 : 0;
  return static_cast<double>(bad);
}

// Follows `loads` links of the list starting at `p` and returns where it stopped. Each load
// depends on the previous one, so the time per load is the memory latency.
const void* chase(const void* p, std::uint64_t loads) noexcept {
  std::uint64_t k = 0;
  for (; loads - k >= 8; k += 8) {
    p = *static_cast<const void* const*>(p);
    p = *static_cast<const void* const*>(p);
    p = *static_cast<const void* const*>(p);
    p = *static_cast<const void* const*>(p);
    p = *static_cast<const void* const*>(p);
    p = *static_cast<const void* const*>(p);
    p = *static_cast<const void* const*>(p);
    p = *static_cast<const void* const*>(p);
  }
  for (; k < loads; ++k) p = *static_cast<const void* const*>(p);
  return p;
}

// ---------------------------------------------------------------------------------------------
// Passes and timing.

// First element of chunk k of t over n floats; chunks start on cache lines. k == t gives n.
std::size_t chunk_begin(std::size_t n, int t, int k) noexcept {
  if (k >= t) return n;
  const std::size_t lines = n / kFloatsPerLine;
  return lines * static_cast<std::size_t>(k) / static_cast<std::size_t>(t) * kFloatsPerLine;
}

// Per chunk: its result and the arena slot that ran it. A cache line each, so that threads
// finishing their chunks do not share lines.
struct alignas(kLine) ChunkSlot {
  double value = 0.0;
  int thread = -1;
};

// One pass: body(begin, end) over each of t contiguous chunks of [0, n), each chunk one task,
// spread over the arena's threads by the static partitioner (one chunk per thread while the
// arena has t threads). Stores each chunk's result and thread in slots[k].
// REQUIRES: called inside the device's arena; slots.size() >= t.
template <typename Body>
void run_pass(int t, std::size_t n, std::vector<ChunkSlot>& slots, const Body& body) {
  oneapi::tbb::parallel_for(
      oneapi::tbb::blocked_range<int>(0, t, 1),
      [&](const oneapi::tbb::blocked_range<int>& r) {
        for (int k = r.begin(); k != r.end(); ++k) {
          ChunkSlot& slot = slots[static_cast<std::size_t>(k)];
          slot.thread = oneapi::tbb::this_task_arena::current_thread_index();
          slot.value = body(chunk_begin(n, t, k), chunk_begin(n, t, k + 1));
        }
      },
      oneapi::tbb::static_partitioner{});
}

// The distinct threads that ran the last pass over t chunks.
int distinct_threads(const std::vector<ChunkSlot>& slots, int t) {
  std::vector<int> ids(static_cast<std::size_t>(t));
  for (std::size_t k = 0; k < ids.size(); ++k) ids[k] = slots[k].thread;
  std::sort(ids.begin(), ids.end());
  return static_cast<int>(std::unique(ids.begin(), ids.end()) - ids.begin());
}

double sum_values(const std::vector<ChunkSlot>& slots, int t) noexcept {
  double s = 0.0;
  for (int k = 0; k < t; ++k) s += slots[static_cast<std::size_t>(k)].value;
  return s;
}

struct Timing {
  std::vector<double> samples;  // seconds per timed pass
  int observed_threads = 0;     // fewest distinct threads of one timed pass
  double median = 0.0;
  double min = 0.0;
  double max = 0.0;
};

// Runs options.warmup untimed passes, then timed passes until there are options.repeats of
// them and they add up to options.min_seconds (at most kMaxSamples). After each timed pass,
// outside the timed interval, `observe()` returns the distinct threads that ran it.
template <typename Pass, typename Observe>
Timing time_passes(const MemoryBenchmarkOptions& options, Pass&& pass, Observe&& observe) {
  for (int w = 0; w < options.warmup; ++w) pass();
  Timing timing;
  timing.observed_threads = std::numeric_limits<int>::max();
  double total = 0.0;
  while (timing.samples.size() < static_cast<std::size_t>(options.repeats) ||
         total < options.min_seconds) {
    const auto t0 = Clock::now();
    pass();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    timing.samples.push_back(seconds);
    timing.observed_threads = std::min(timing.observed_threads, observe());
    total += seconds;
    if (timing.samples.size() >= kMaxSamples) break;
  }
  std::vector<double> sorted = timing.samples;
  std::sort(sorted.begin(), sorted.end());
  const std::size_t m = sorted.size() / 2;
  timing.median = sorted.size() % 2 == 1 ? sorted[m] : 0.5 * (sorted[m - 1] + sorted[m]);
  timing.min = sorted.front();
  timing.max = sorted.back();
  return timing;
}

// ---------------------------------------------------------------------------------------------
// Validation.

void check_size(std::string_view name, std::size_t bytes, std::size_t max) {
  NUMESH_CHECK(bytes % kLine == 0 && bytes >= kMinBytes && bytes <= max, ValueError,
               "memory benchmark: {} = {} ({}) must be a multiple of 64 bytes from {} to {}", name,
               bytes, human_bytes(bytes), human_bytes(kMinBytes), human_bytes(max));
}

void check_timing(const MemoryBenchmarkOptions& o) {
  check_size("bytes", o.bytes, kMaxBytes);
  NUMESH_CHECK(o.warmup >= 0 && o.warmup <= kMaxWarmup, ValueError,
               "memory benchmark: warmup = {} must be in [0, {}]", o.warmup, kMaxWarmup);
  NUMESH_CHECK(o.repeats >= 1 && o.repeats <= kMaxRepeats, ValueError,
               "memory benchmark: repeats = {} must be in [1, {}]", o.repeats, kMaxRepeats);
  NUMESH_CHECK(
      std::isfinite(o.min_seconds) && o.min_seconds >= 0.0 && o.min_seconds <= kMaxMinSeconds,
      ValueError, "memory benchmark: min_seconds = {} must be in [0, {}]", o.min_seconds,
      kMaxMinSeconds);
}

void check_kernels_and_threads(const MemoryBenchmarkOptions& o) {
  NUMESH_CHECK(!o.kernels.empty(), ValueError,
               "memory benchmark: kernels is empty (choose from read, copy, triad)");
  for (std::size_t i = 0; i < o.kernels.size(); ++i) {
    NUMESH_CHECK(std::find(o.kernels.begin(), o.kernels.begin() + static_cast<std::ptrdiff_t>(i),
                           o.kernels[i]) == o.kernels.begin() + static_cast<std::ptrdiff_t>(i),
                 ValueError, "memory benchmark: kernel '{}' is listed twice",
                 to_string(o.kernels[i]));
  }
  NUMESH_CHECK(!o.threads.empty(), ValueError,
               "memory benchmark: threads is empty (list thread counts; 0 means all of a "
               "device's threads)");
  for (std::size_t i = 0; i < o.threads.size(); ++i) {
    const int t = o.threads[i];
    NUMESH_CHECK(t >= 0, ValueError,
                 "memory benchmark: thread count {} is negative (0 means all of a device's "
                 "threads)",
                 t);
    NUMESH_CHECK(std::find(o.threads.begin(), o.threads.begin() + static_cast<std::ptrdiff_t>(i),
                           t) == o.threads.begin() + static_cast<std::ptrdiff_t>(i),
                 ValueError, "memory benchmark: thread count {} is listed twice", t);
  }
}

void check_latency(const MemoryBenchmarkOptions& o) {
  check_size("latency_bytes", o.latency_bytes, kMaxLatencyBytes);
  NUMESH_CHECK(o.latency_loads >= 1 && o.latency_loads <= kMaxLatencyLoads, ValueError,
               "memory benchmark: latency_loads = {} must be in [1, {}]", o.latency_loads,
               kMaxLatencyLoads);
}

std::string device_name(const Device& d) {
  return fmt::format("device {} ({})", d.index(), d.spec().label);
}

// The arrays the kernels need at once, and the kernel needing most of them.
std::pair<int, MemoryKernel> arrays_needed(const std::vector<MemoryKernel>& kernels) {
  std::pair<int, MemoryKernel> most{0, MemoryKernel::kRead};
  for (MemoryKernel k : kernels) {
    if (stream_arrays(k) > most.first) most = {stream_arrays(k), k};
  }
  return most;
}

// The device's thread counts of options.threads, 0 resolved, each once, in list order.
// Throws: ValueError for a count above the device's threads.
std::vector<int> resolve_threads(const Device& d, const std::vector<int>& threads) {
  const int all = std::max(1, d.spec().threads);
  std::vector<int> resolved;
  for (int t : threads) {
    NUMESH_CHECK(t <= all, ValueError,
                 "memory benchmark: thread count {} is above the {} thread{} of {}", t, all,
                 all == 1 ? "" : "s", device_name(d));
    const int r = t == 0 ? all : t;
    if (std::find(resolved.begin(), resolved.end(), r) == resolved.end()) resolved.push_back(r);
  }
  return resolved;
}

// Throws ValueError when `needed` bytes exceed what the topology reports for node `node`
// (nothing to check when the node or its size is unknown). `who` needs them, `why` (may be
// empty) says what they are.
void check_node_memory(const Topology& topology, int node, std::size_t needed,
                       const std::string& who, const std::string& why) {
  if (node < 0 || static_cast<std::size_t>(node) >= topology.numa_nodes().size()) return;
  const std::uint64_t has = topology.numa_nodes()[static_cast<std::size_t>(node)].memory_bytes;
  NUMESH_CHECK(has == 0 || needed <= has, ValueError,
               "memory benchmark: {} needs {} ({} bytes{}{}) on NUMA node {}, which has {} ({} "
               "bytes, as hwloc reports it)",
               who, human_bytes(needed), needed, why.empty() ? "" : ": ", why, node,
               human_bytes(has), has);
}

// ---------------------------------------------------------------------------------------------
// Memory for one column of the node matrix.

// A buffer on one NUMA node: from the allocator of a device on the node (a DeviceBuffer), or
// for a node without devices bound by hwloc (or, on a topology that cannot bind, from
// aligned_alloc). Move-only through unique_ptr and DeviceBuffer.
class NodeBuffer {
 public:
  // The buffer of `bytes` for node `node`; empty() when it cannot be placed (see `note`).
  NodeBuffer(const DeviceSet& devices, int node, std::size_t bytes) : bytes_(bytes) {
    const Topology& topology = devices.topology();
    for (std::size_t i = 0; i < devices.size(); ++i) {
      Device& d = devices.device(i);
      if (d.spec().numa_node != node) continue;
      device_buffer_ = d.allocate(bytes);
      data_ = reinterpret_cast<float*>(device_buffer_.data());
      binding_ = device_buffer_.binding();
      allocated_by_ = d.index();
      pages_on_node_ = device_buffer_.query_node();
      if (binding_ == MemoryBinding::kFirstTouch) {
        note_ = fmt::format(
            "memory cannot be bound to NUMA node {}: placed by first touch from {}'s threads", node,
            device_name(d));
      }
      break;
    }
    if (data_ == nullptr && topology.can_bind()) {
      // No device lives on the node (memory only, or its PUs are outside the process binding).
      try {
        node_memory_.emplace(topology, node, bytes);
      } catch (const TopologyError& e) {
        note_ = fmt::format(
            "memory cannot be bound to NUMA node {} ({}) and no device lives on it to place it "
            "by first touch: not measured",
            node, e.what());
        return;
      }
      data_ = reinterpret_cast<float*>(node_memory_->data());
      binding_ = MemoryBinding::kBound;
      pages_on_node_ = node_memory_->query_node();
    } else if (data_ == nullptr) {
      void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
      if (p == nullptr) throw std::bad_alloc();
      raw_ = RawPtr(p, RawFree{});
      data_ = static_cast<float*>(p);
      binding_ = MemoryBinding::kUnbound;
      std::memset(p, 0, bytes);
    }
    if (binding_ == MemoryBinding::kUnbound) {
      note_ = fmt::format(
          "binding is not possible on this {} topology: the pages lie wherever the OS put "
          "them, not necessarily on NUMA node {}",
          to_string(topology.source()), node);
    }
    if (pages_on_node_.has_value() && *pages_on_node_ != node) {
      note_ += fmt::format("{}the kernel reports the pages {}", note_.empty() ? "" : "; ",
                           *pages_on_node_ < 0 ? std::string("spread over several nodes")
                                               : fmt::format("on NUMA node {}", *pages_on_node_));
    }
  }

  bool empty() const noexcept { return data_ == nullptr; }
  float* data() const noexcept { return data_; }
  std::size_t bytes() const noexcept { return bytes_; }
  MemoryBinding binding() const noexcept { return binding_; }
  int allocated_by() const noexcept { return allocated_by_; }
  const std::optional<int>& pages_on_node() const noexcept { return pages_on_node_; }
  const std::string& note() const noexcept { return note_; }

 private:
  struct RawFree {  // aligned_alloc's memory
    void operator()(void* p) const noexcept { std::free(p); }
  };
  using RawPtr = std::unique_ptr<void, RawFree>;

  DeviceBuffer device_buffer_;
  std::optional<NodeMemory> node_memory_;
  RawPtr raw_{nullptr, RawFree{}};
  float* data_ = nullptr;
  std::size_t bytes_ = 0;
  MemoryBinding binding_ = MemoryBinding::kUnbound;
  int allocated_by_ = -1;
  std::optional<int> pages_on_node_;
  std::string note_;
};

// ---------------------------------------------------------------------------------------------
// Measurements.

DeviceMemoryInfo device_info(Device& d) {
  DeviceMemoryInfo info;
  info.device = d.index();
  info.label = d.spec().label;
  info.numa_node = d.spec().numa_node;
  info.threads = std::max(1, d.spec().threads);
  info.pinning = d.pinning();
  info.binding = d.memory_binding();
  return info;
}

// Fills a[0, n) with `value` on all of the device's threads. The pages are already placed
// (allocate() zero-filled them), so this only sets the values the kernels check.
void fill(Device& d, float* a, float value, std::size_t n) {
  const int all = std::max(1, d.spec().threads);
  std::vector<ChunkSlot> slots(static_cast<std::size_t>(all));
  d.execute([&] {
    run_pass(all, n, slots, [&](std::size_t lo, std::size_t hi) {
      fill_kernel(a + lo, value, hi - lo);
      return 0.0;
    });
  });
}

// Elements of a[0, n) that are not `value`, counted on the device's threads.
std::size_t count_wrong(Device& d, const float* a, float value, std::size_t n) {
  const int all = std::max(1, d.spec().threads);
  std::vector<ChunkSlot> slots(static_cast<std::size_t>(all));
  return d.execute([&] {
    run_pass(all, n, slots, [&](std::size_t lo, std::size_t hi) {
      return count_not_equal(a + lo, value, hi - lo);
    });
    return static_cast<std::size_t>(sum_values(slots, all));
  });
}

// Times the read kernel over b[0, n) with t of the device's threads and checks its sum.
Timing time_read(Device& d, const float* b, std::size_t n, int t,
                 const MemoryBenchmarkOptions& options) {
  std::vector<ChunkSlot> slots(static_cast<std::size_t>(t));
  Timing timing = d.execute([&] {
    return time_passes(
        options,
        [&] {
          run_pass(t, n, slots,
                   [b](std::size_t lo, std::size_t hi) { return read_kernel(b + lo, hi - lo); });
        },
        [&] { return distinct_threads(slots, t); });
  });
  // The sum is consumed (checked) so that the compiler cannot drop the loads.
  const double sum = sum_values(slots, t);
  NUMESH_CHECK(sum == static_cast<double>(n) * kBValue, Error,
               "memory benchmark: {} read {} floats of {} and summed {}, expected {}",
               device_name(d), n, kBValue, sum, static_cast<double>(n) * kBValue);
  return timing;
}

void measure_one_device(Device& d, const std::vector<int>& threads,
                        const MemoryBenchmarkOptions& options, DeviceBandwidthResult& result) {
  const std::size_t n = options.bytes / sizeof(float);
  const int arrays = arrays_needed(options.kernels).first;
  // b is read by every kernel, a is written by copy and triad, c is triad's second input.
  std::vector<DeviceBuffer> buffers;
  for (int i = 0; i < arrays; ++i) buffers.push_back(d.allocate(options.bytes));
  float* b = reinterpret_cast<float*>(buffers[0].data());
  float* a = arrays > 1 ? reinterpret_cast<float*>(buffers[1].data()) : nullptr;
  float* c = arrays > 2 ? reinterpret_cast<float*>(buffers[2].data()) : nullptr;

  DeviceMemoryInfo info = device_info(d);
  info.binding = buffers[0].binding();
  info.pages_on_node = buffers[0].query_node();
  result.devices.push_back(info);

  fill(d, b, kBValue, n);
  if (c != nullptr) fill(d, c, kCValue, n);

  for (MemoryKernel kernel : options.kernels) {
    for (int t : threads) {
      if (options.progress) {
        options.progress(fmt::format("{} {} {} thread{}", device_name(d), to_string(kernel), t,
                                     t == 1 ? "" : "s"));
      }
      Timing timing;
      if (kernel == MemoryKernel::kRead) {
        timing = time_read(d, b, n, t, options);
      } else {
        // Zero the destination first, so that the check below sees this measurement's writes.
        fill(d, a, 0.0f, n);
        std::vector<ChunkSlot> slots(static_cast<std::size_t>(t));
        timing = d.execute([&] {
          return time_passes(
              options,
              [&] {
                run_pass(t, n, slots, [&](std::size_t lo, std::size_t hi) {
                  if (kernel == MemoryKernel::kCopy) {
                    copy_kernel(a + lo, b + lo, hi - lo);
                  } else {
                    triad_kernel(a + lo, b + lo, c + lo, kScalar, hi - lo);
                  }
                  return 0.0;
                });
              },
              [&] { return distinct_threads(slots, t); });
        });
        const float expected = kernel == MemoryKernel::kCopy ? kBValue : kTriadValue;
        const std::size_t wrong = count_wrong(d, a, expected, n);
        NUMESH_CHECK(wrong == 0, Error,
                     "memory benchmark: {} {} with {} threads left {} of {} elements different "
                     "from {}",
                     device_name(d), to_string(kernel), t, wrong, n, expected);
      }
      BandwidthMeasurement m;
      m.device = d.index();
      m.kernel = kernel;
      m.threads = t;
      m.observed_threads = timing.observed_threads;
      m.array_bytes = options.bytes;
      m.counted_bytes = static_cast<std::size_t>(stream_arrays(kernel)) * options.bytes;
      m.samples = static_cast<int>(timing.samples.size());
      m.median_seconds = timing.median;
      m.min_seconds = timing.min;
      m.max_seconds = timing.max;
      m.gbps = static_cast<double>(m.counted_bytes) / timing.median / 1e9;
      m.best_gbps = static_cast<double>(m.counted_bytes) / timing.min / 1e9;
      result.measurements.push_back(m);
    }
  }
}

// Checks everything measure_device_bandwidth needs of the devices `indices`, then measures
// them in order.
DeviceBandwidthResult measure_devices(const DeviceSet& devices,
                                      const std::vector<std::size_t>& indices,
                                      const MemoryBenchmarkOptions& options) {
  check_timing(options);
  check_kernels_and_threads(options);
  const auto [arrays, widest] = arrays_needed(options.kernels);
  std::vector<std::vector<int>> threads;
  for (std::size_t i : indices) {
    Device& d = devices.device(i);
    threads.push_back(resolve_threads(d, options.threads));
    check_node_memory(devices.topology(), d.spec().numa_node,
                      static_cast<std::size_t>(arrays) * options.bytes, device_name(d),
                      fmt::format("{} array{} of {} for {}", arrays, arrays == 1 ? "" : "s",
                                  human_bytes(options.bytes), to_string(widest)));
  }
  DeviceBandwidthResult result;
  result.array_bytes = options.bytes;
  for (std::size_t k = 0; k < indices.size(); ++k) {
    measure_one_device(devices.device(indices[k]), threads[k], options, result);
  }
  return result;
}

// Builds, in buf, one cycle through all its cache lines in random order: the first bytes of
// each line point at the next line. Returns the first line.
const void* build_chase_list(std::byte* buf, std::size_t bytes) {
  const std::size_t lines = bytes / kLine;
  std::vector<std::size_t> order(lines);
  std::iota(order.begin(), order.end(), std::size_t{0});
  // A fixed seed: the same list (and so the same access pattern) in every run.
  std::mt19937_64 rng(0x6e756d657368ULL);
  std::shuffle(order.begin(), order.end(), rng);
  for (std::size_t k = 0; k < lines; ++k) {
    const void* next = buf + order[(k + 1) % lines] * kLine;
    std::memcpy(buf + order[k] * kLine, &next, sizeof next);
  }
  return buf + order[0] * kLine;
}

json optional_json(const std::optional<int>& v) { return v ? json(*v) : json(nullptr); }
json optional_json(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

json info_json(const DeviceMemoryInfo& d) {
  return {{"device", d.device},
          {"label", d.label},
          {"numa_node", d.numa_node},
          {"threads", d.threads},
          {"pinning", std::string(to_string(d.pinning))},
          {"memory_binding", std::string(to_string(d.binding))},
          {"pages_on_node", optional_json(d.pages_on_node)}};
}

}  // namespace

// -------------------------------------------------------------------------------------------
// Public API.

std::string_view to_string(MemoryKernel kernel) noexcept {
  switch (kernel) {
    case MemoryKernel::kRead:
      return "read";
    case MemoryKernel::kCopy:
      return "copy";
    case MemoryKernel::kTriad:
      return "triad";
  }
  return "?";
}

MemoryKernel parse_memory_kernel(std::string_view text) {
  if (text == "read") return MemoryKernel::kRead;
  if (text == "copy") return MemoryKernel::kCopy;
  if (text == "triad") return MemoryKernel::kTriad;
  throw ValueError(fmt::format("unknown memory kernel '{}' (choose read, copy or triad)", text));
}

int stream_arrays(MemoryKernel kernel) noexcept {
  switch (kernel) {
    case MemoryKernel::kRead:
      return 1;
    case MemoryKernel::kCopy:
      return 2;
    case MemoryKernel::kTriad:
      return 3;
  }
  return 1;
}

const BandwidthMeasurement* DeviceBandwidthResult::find(int device, MemoryKernel kernel,
                                                        int threads) const noexcept {
  for (const BandwidthMeasurement& m : measurements) {
    if (m.device == device && m.kernel == kernel && m.threads == threads) return &m;
  }
  return nullptr;
}

json DeviceBandwidthResult::to_json() const {
  json devs = json::array();
  for (const DeviceMemoryInfo& d : devices) devs.push_back(info_json(d));
  json ms = json::array();
  for (const BandwidthMeasurement& m : measurements) {
    ms.push_back({{"device", m.device},
                  {"kernel", std::string(to_string(m.kernel))},
                  {"threads", m.threads},
                  {"observed_threads", m.observed_threads},
                  {"array_bytes", m.array_bytes},
                  {"counted_bytes", m.counted_bytes},
                  {"samples", m.samples},
                  {"median_seconds", m.median_seconds},
                  {"min_seconds", m.min_seconds},
                  {"max_seconds", m.max_seconds},
                  {"gbps", m.gbps},
                  {"best_gbps", m.best_gbps}});
  }
  return {{"array_bytes", array_bytes},
          {"devices", std::move(devs)},
          {"measurements", std::move(ms)},
          {"units",
           {{"gbps", "1e9 bytes per second, from the median pass"},
            {"counted_bytes",
             "STREAM's count: read 1x, copy 2x, triad 3x the array size (write-allocate "
             "traffic not counted)"}}}};
}

std::optional<double> NodeMatrixResult::read_gbps_at(std::size_t device, std::size_t node) const {
  NUMESH_CHECK(device < rows() && node < cols(), IndexError,
               "node matrix entry ({}, {}) is out of range: {} devices x {} nodes", device, node,
               rows(), cols());
  return read_gbps[device * cols() + node];
}

std::optional<double> NodeMatrixResult::latency_ns_at(std::size_t device, std::size_t node) const {
  NUMESH_CHECK(device < rows() && node < cols(), IndexError,
               "node matrix entry ({}, {}) is out of range: {} devices x {} nodes", device, node,
               rows(), cols());
  return latency_ns[device * cols() + node];
}

json NodeMatrixResult::to_json() const {
  json devs = json::array();
  for (const DeviceMemoryInfo& d : devices) devs.push_back(info_json(d));
  json ns = json::array();
  for (const NodeMemoryInfo& n : nodes) {
    ns.push_back({{"node", n.node},
                  {"os_index", n.os_index},
                  {"measured", n.measured},
                  {"memory_binding", std::string(to_string(n.binding))},
                  {"allocated_by_device", n.allocated_by_device},
                  {"pages_on_node", optional_json(n.pages_on_node)},
                  {"note", n.note}});
  }
  json read = json::array();
  json latency = json::array();
  for (std::size_t i = 0; i < rows(); ++i) {
    json r = json::array();
    json l = json::array();
    for (std::size_t j = 0; j < cols(); ++j) {
      r.push_back(optional_json(read_gbps[i * cols() + j]));
      l.push_back(optional_json(latency_ns[i * cols() + j]));
    }
    read.push_back(std::move(r));
    latency.push_back(std::move(l));
  }
  return {{"bytes", bytes},
          {"latency_bytes", latency_bytes},
          {"latency_loads", latency_loads},
          {"devices", std::move(devs)},
          {"nodes", std::move(ns)},
          {"read_gbps", std::move(read)},
          {"latency_ns", std::move(latency)},
          {"units",
           {{"read_gbps",
             "1e9 bytes per second read by all of the row device's threads, "
             "from the median pass"},
            {"latency_ns",
             "nanoseconds per dependent load of one thread, from the median "
             "pass"}}}};
}

DeviceBandwidthResult measure_device_bandwidth(const DeviceSet& devices,
                                               const MemoryBenchmarkOptions& options) {
  std::vector<std::size_t> all(devices.size());
  std::iota(all.begin(), all.end(), std::size_t{0});
  return measure_devices(devices, all, options);
}

DeviceBandwidthResult measure_device_bandwidth(const DeviceSet& devices, std::size_t device,
                                               const MemoryBenchmarkOptions& options) {
  (void)devices.device(device);  // IndexError before anything else
  return measure_devices(devices, {device}, options);
}

NodeMatrixResult measure_node_matrix(const DeviceSet& devices,
                                     const MemoryBenchmarkOptions& options) {
  check_timing(options);
  check_latency(options);
  const Topology& topology = devices.topology();
  for (const NumaNode& node : topology.numa_nodes()) {
    check_node_memory(topology, node.index, options.bytes, "the read buffer (bytes)", "");
    check_node_memory(topology, node.index, options.latency_bytes,
                      "the latency list (latency_bytes)", "");
  }

  NodeMatrixResult result;
  result.bytes = options.bytes;
  result.latency_bytes = options.latency_bytes;
  result.latency_loads = options.latency_loads;
  for (std::size_t i = 0; i < devices.size(); ++i)
    result.devices.push_back(device_info(devices.device(i)));
  const std::size_t rows = devices.size();
  const std::size_t cols = topology.numa_nodes().size();
  result.read_gbps.assign(rows * cols, std::nullopt);
  result.latency_ns.assign(rows * cols, std::nullopt);

  const std::size_t n = options.bytes / sizeof(float);
  for (std::size_t j = 0; j < cols; ++j) {
    const NumaNode& node = topology.numa_nodes()[j];
    NodeMemoryInfo info;
    info.node = node.index;
    info.os_index = node.os_index;
    {
      NodeBuffer buffer(devices, node.index, options.bytes);
      info.binding = buffer.binding();
      info.allocated_by_device = buffer.allocated_by();
      info.pages_on_node = buffer.pages_on_node();
      info.note = buffer.note();
      info.measured = !buffer.empty();
      if (!info.measured) {
        result.nodes.push_back(std::move(info));
        continue;
      }
      // Pages are already placed (bound, or first-touched by the allocating device), so any
      // device may write the values.
      Device& filler = devices.device(
          buffer.allocated_by() >= 0 ? static_cast<std::size_t>(buffer.allocated_by()) : 0);
      fill(filler, buffer.data(), kBValue, n);
      for (std::size_t i = 0; i < rows; ++i) {
        Device& d = devices.device(i);
        if (options.progress) {
          options.progress(fmt::format("{} reads NUMA node {}", device_name(d), node.index));
        }
        const Timing timing =
            time_read(d, buffer.data(), n, std::max(1, d.spec().threads), options);
        result.read_gbps[i * cols + j] = static_cast<double>(options.bytes) / timing.median / 1e9;
      }
    }
    NodeBuffer list(devices, node.index, options.latency_bytes);
    if (list.empty()) {  // the read buffer could be placed, this one not: say so, leave it out
      info.note += fmt::format("{}the latency list could not be placed: {}",
                               info.note.empty() ? "" : "; ", list.note());
      result.nodes.push_back(std::move(info));
      continue;
    }
    if (list.binding() != info.binding) {
      info.note += fmt::format("{}the latency list's placement is {}",
                               info.note.empty() ? "" : "; ", to_string(list.binding()));
    }
    const void* cursor =
        build_chase_list(reinterpret_cast<std::byte*>(list.data()), options.latency_bytes);
    for (std::size_t i = 0; i < rows; ++i) {
      Device& d = devices.device(i);
      if (options.progress) {
        options.progress(fmt::format("{} chases NUMA node {}", device_name(d), node.index));
      }
      // One thread: the one running this functor inside the device's arena (pinned to it).
      const Timing timing = d.execute([&] {
        return time_passes(
            options, [&] { cursor = chase(cursor, options.latency_loads); }, [] { return 1; });
      });
      result.latency_ns[i * cols + j] =
          timing.median / static_cast<double>(options.latency_loads) * 1e9;
    }
    NUMESH_CHECK(cursor != nullptr, Error,
                 "memory benchmark: the latency list of node {} is broken", node.index);
    result.nodes.push_back(std::move(info));
  }
  return result;
}

}  // namespace numesh::diagnostics
