#include "bench_memory.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <utility>
#include <vector>

#include "bench_common.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/units.hpp"
#include "numesh/diagnostics/memory_benchmark.hpp"
#include "numesh/runtime/device.hpp"
#include "numesh/runtime/device_buffer.hpp"
#include "parsers.hpp"
#include "render.hpp"

namespace numesh::tools {

namespace {

using diagnostics::MemoryKernel;

// The memory benchmark's own limits (memory_benchmark.hpp), checked here first so that the
// messages name the options.
constexpr std::size_t kMaxArrayBytes = std::size_t{1} << 40;
constexpr std::size_t kMaxLatencyBytes = std::size_t{64} << 30;
constexpr int kMaxRepeats = 100000;
constexpr double kMaxMinTime = 3600.0;
constexpr std::uint64_t kMaxLatencyLoads = 10'000'000'000;

std::string plural(int n, const char* word) {
  return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s");
}

// The thread counts device `d` measures: the sweep's counts up to its threads (all = its
// threads), each once, in order; `skipped` gets the counts above its threads.
std::vector<int> device_threads(const runtime::Device& d, const std::vector<int>& sweep,
                                const std::string& text, std::vector<int>& skipped) {
  const int all = std::max(1, d.spec().threads);
  std::vector<int> counts;
  for (int c : sweep) {
    if (c > all) {
      skipped.push_back(c);
      continue;
    }
    const int resolved = c == 0 ? all : c;
    if (std::find(counts.begin(), counts.end(), resolved) == counts.end())
      counts.push_back(resolved);
  }
  NUMESH_CHECK(!counts.empty(), ValueError,
               "--threads-sweep '{}': every count is above the {} of device {} ({}); add 'all' or "
               "a smaller count",
               text, plural(all, "thread"), d.index(), d.spec().label);
  return counts;
}

std::string cell(const std::optional<double>& v, int precision) {
  return v ? fmt::format("{:.{}f}", *v, precision) : std::string("-");
}

// One devices x nodes table of the matrix, values from `at(row, col)`.
template <typename At>
void write_matrix(const diagnostics::NodeMatrixResult& m, int precision, At&& at,
                  std::ostream& out) {
  std::vector<std::string> labels;
  std::size_t label_width = 0;
  for (const diagnostics::DeviceMemoryInfo& d : m.devices) {
    labels.push_back(fmt::format("{} {}", d.device, d.label));
    label_width = std::max(label_width, labels.back().size());
  }
  out << fmt::format("  {:<{}}", "", label_width);
  for (const diagnostics::NodeMemoryInfo& n : m.nodes) {
    out << fmt::format(" {:>9}", fmt::format("node {}{}", n.node, n.note.empty() ? "" : "*"));
  }
  out << "\n";
  for (std::size_t i = 0; i < m.rows(); ++i) {
    out << fmt::format("  {:<{}}", labels[i], label_width);
    for (std::size_t j = 0; j < m.cols(); ++j)
      out << fmt::format(" {:>9}", cell(at(i, j), precision));
    out << "\n";
  }
}

void write_bandwidth(const diagnostics::DeviceBandwidthResult& r, std::ostream& out) {
  bool oversubscribed = false;
  for (const diagnostics::DeviceMemoryInfo& d : r.devices) {
    std::string pages = "pages on an unknown node";
    if (d.pages_on_node) {
      pages = *d.pages_on_node < 0 ? std::string("pages on several nodes")
                                   : fmt::format("pages on node {}", *d.pages_on_node);
    }
    out << fmt::format("\ndevice {} ({}): NUMA node {}, {}, memory {}, {}\n", d.device, d.label,
                       d.numa_node, plural(d.threads, "thread"), runtime::to_string(d.binding),
                       pages);
    out << fmt::format("  {:<6}  {:>7}  {:>8}  {:>9}  {:>9}  {:>6}\n", "kernel", "threads", "GB/s",
                       "best GB/s", "median ms", "passes");
    for (const diagnostics::BandwidthMeasurement& m : r.measurements) {
      if (m.device != d.device) continue;
      const bool fewer = m.observed_threads < m.threads;
      oversubscribed = oversubscribed || fewer;
      out << fmt::format("  {:<6}  {:>7}  {:>8.2f}  {:>9.2f}  {:>9.3f}  {:>6}\n",
                         diagnostics::to_string(m.kernel),
                         fmt::format("{}{}", m.threads, fewer ? "*" : ""), m.gbps, m.best_gbps,
                         m.median_seconds * 1e3, m.samples);
    }
  }
  if (oversubscribed) {
    out << "* fewer threads than asked ran a pass (the machine is oversubscribed): that rate is "
           "not the device's\n";
  }
}

void write_node_matrix(const diagnostics::NodeMatrixResult& m, std::ostream& out) {
  out << fmt::format(
      "\nread GB/s: all of the row device's threads read {} on the column's NUMA node\n",
      human_bytes(m.bytes));
  write_matrix(
      m, 2, [&](std::size_t i, std::size_t j) { return m.read_gbps_at(i, j); }, out);
  out << fmt::format(
      "\nlatency ns: one of the row device's threads follows a random cycle over {} on the "
      "column's node ({} dependent loads per pass)\n",
      human_bytes(m.latency_bytes), m.latency_loads);
  write_matrix(
      m, 1, [&](std::size_t i, std::size_t j) { return m.latency_ns_at(i, j); }, out);
  bool unmeasured = false;
  for (const auto& v : m.read_gbps) unmeasured = unmeasured || !v;
  for (const auto& v : m.latency_ns) unmeasured = unmeasured || !v;
  bool noted = false;
  for (const diagnostics::NodeMemoryInfo& n : m.nodes) noted = noted || !n.note.empty();
  if (!noted && !unmeasured) return;
  out << "notes:\n";
  for (const diagnostics::NodeMemoryInfo& n : m.nodes) {
    if (!n.note.empty()) out << fmt::format("  node {}* (P#{}): {}\n", n.node, n.os_index, n.note);
  }
  if (unmeasured) out << "  -: not measured (the column's note says why)\n";
}

// The options checked before a device exists: the arrays' and the latency cycle's bytes, the
// kernels (and their names) and the thread counts of the sweep.
struct CheckedMemoryOptions {
  std::size_t bytes = 0;
  std::size_t latency_bytes = 0;
  std::vector<MemoryKernel> kernels;
  std::vector<std::string> kernel_names;
  std::vector<int> sweep;
};

// Checks every option against the memory benchmark's limits, in the order of their messages.
// Throws: ValueError naming the option.
CheckedMemoryOptions check_memory_options(const BenchMemoryOptions& o) {
  CheckedMemoryOptions c;
  c.bytes = parse_array_bytes("--size", o.size, kMaxArrayBytes);
  c.latency_bytes = parse_array_bytes("--latency-size", o.latency_size, kMaxLatencyBytes);
  c.kernels = parse_memory_kernels(o.kernels);
  c.sweep = parse_threads_sweep(o.threads_sweep);
  NUMESH_CHECK(o.repeats >= 1 && o.repeats <= kMaxRepeats, ValueError,
               "--repeats {} must be between 1 and {}", o.repeats, kMaxRepeats);
  NUMESH_CHECK(std::isfinite(o.min_time) && o.min_time >= 0.0 && o.min_time <= kMaxMinTime,
               ValueError, "--min-time {} must be between 0 and {} seconds", o.min_time,
               kMaxMinTime);
  NUMESH_CHECK(o.latency_loads >= 1 && o.latency_loads <= kMaxLatencyLoads, ValueError,
               "--latency-loads {} must be between 1 and {}", o.latency_loads, kMaxLatencyLoads);
  for (MemoryKernel k : c.kernels) c.kernel_names.emplace_back(diagnostics::to_string(k));
  return c;
}

// Each device's thread counts, and one note per group of devices whose sweep lost the same
// counts.
struct MemorySweeps {
  std::vector<std::vector<int>> threads;  // per device
  std::vector<std::string> notes;
};

MemorySweeps memory_sweeps(const runtime::DeviceSet& devices, const std::vector<int>& sweep,
                           const std::string& text) {
  MemorySweeps s;
  // Devices whose sweep lost the same counts, for one note each: (skipped, threads) -> devices.
  std::vector<std::pair<std::pair<std::vector<int>, int>, std::vector<std::string>>> left_out;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const runtime::Device& d = devices.device(i);
    std::vector<int> skipped;
    s.threads.push_back(device_threads(d, sweep, text, skipped));
    if (skipped.empty()) continue;
    const std::pair<std::vector<int>, int> key{skipped, std::max(1, d.spec().threads)};
    auto group = std::find_if(left_out.begin(), left_out.end(),
                              [&](const auto& g) { return g.first == key; });
    if (group == left_out.end()) group = left_out.insert(left_out.end(), {key, {}});
    group->second.push_back(fmt::format("{} ({})", d.index(), d.spec().label));
  }
  for (const auto& [key, names] : left_out) {
    s.notes.push_back(fmt::format("--threads-sweep {} left out for device{} {}, which {} {}",
                                  fmt::join(key.first, ", "), names.size() == 1 ? "" : "s",
                                  fmt::join(names, ", "), names.size() == 1 ? "has" : "have",
                                  plural(key.second, "thread")));
  }
  return s;
}

// Checks the widest kernel's arrays against each device's node and, for the node matrix, the
// arrays and the latency cycle against every node.
// Throws: ValueError naming the option, the size and the node.
void check_memory_fits(const runtime::DeviceSet& devices, const CheckedMemoryOptions& c,
                       bool matrix) {
  int arrays = 0;
  MemoryKernel widest = MemoryKernel::kRead;
  for (MemoryKernel k : c.kernels) {
    if (diagnostics::stream_arrays(k) > arrays) {
      arrays = diagnostics::stream_arrays(k);
      widest = k;
    }
  }
  check_device_nodes_fit(
      devices, "--size", c.bytes, arrays,
      fmt::format("{} needs {}", diagnostics::to_string(widest), plural(arrays, "array")));
  if (matrix) {
    check_all_nodes_fit(devices, "--size", c.bytes);
    check_all_nodes_fit(devices, "--latency-size", c.latency_bytes);
  }
}

// Prints the devices, the arrays and kernels, the notes and what GB/s counts.
void report_memory_setup(const BenchMemoryOptions& o, const runtime::DeviceSet& devices,
                         const CheckedMemoryOptions& c, const std::vector<std::string>& notes,
                         std::ostream& out) {
  out << fmt::format("numesh bench memory: {} ({} policy), arrays of {}, kernels {}\n",
                     plural(static_cast<int>(devices.size()), "device"),
                     runtime::to_string(devices.options().policy), format_bytes(c.bytes),
                     fmt::join(c.kernel_names, ", "));
  write_devices_text(devices, out);
  for (const std::string& note : notes) out << "note: " << note << "\n";
  out << fmt::format(
      "GB/s: 1e9 bytes per second, STREAM's count (read 1x, copy 2x, triad 3x the array); "
      "median and fastest of at least {} timed pass{} after one warm-up\n",
      o.repeats, o.repeats == 1 ? "" : "es");
  out.flush();
}

// The measurements of both parts: each device's kernels x thread counts, and the matrix's two
// entries per device and node.
std::size_t memory_measurement_count(const runtime::DeviceSet& devices,
                                     const CheckedMemoryOptions& c, const MemorySweeps& sweeps,
                                     bool matrix) {
  std::size_t total = 0;
  for (const auto& t : sweeps.threads) total += c.kernels.size() * t.size();
  if (matrix) total += 2 * devices.size() * devices.topology().numa_nodes().size();
  return total;
}

// The benchmark's options, but for the thread counts (each device's own) and the progress.
diagnostics::MemoryBenchmarkOptions memory_benchmark_options(const BenchMemoryOptions& o,
                                                             const CheckedMemoryOptions& c) {
  diagnostics::MemoryBenchmarkOptions options;
  options.bytes = c.bytes;
  options.kernels = c.kernels;
  options.repeats = o.repeats;
  options.min_seconds = o.min_time;
  options.latency_bytes = c.latency_bytes;
  options.latency_loads = o.latency_loads;
  return options;
}

// Each device in turn, over its own thread counts (left in `options.threads`: the last
// device's).
diagnostics::DeviceBandwidthResult measure_memory_bandwidth(
    const runtime::DeviceSet& devices, std::size_t bytes, const MemorySweeps& sweeps,
    diagnostics::MemoryBenchmarkOptions& options) {
  diagnostics::DeviceBandwidthResult bandwidth;
  bandwidth.array_bytes = bytes;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    options.threads = sweeps.threads[i];
    diagnostics::DeviceBandwidthResult one =
        diagnostics::measure_device_bandwidth(devices, i, options);
    bandwidth.devices.insert(bandwidth.devices.end(), one.devices.begin(), one.devices.end());
    bandwidth.measurements.insert(bandwidth.measurements.end(), one.measurements.begin(),
                                  one.measurements.end());
  }
  return bandwidth;
}

// The node matrix measured and printed, or why it is not.
std::optional<diagnostics::NodeMatrixResult> measure_memory_node_matrix(
    const BenchMemoryOptions& o, const runtime::DeviceSet& devices, bool matrix,
    const diagnostics::MemoryBenchmarkOptions& options, std::ostream& out) {
  std::optional<diagnostics::NodeMatrixResult> node_matrix;
  if (matrix) {
    node_matrix = diagnostics::measure_node_matrix(devices, options);
    write_node_matrix(*node_matrix, out);
  } else {
    out << fmt::format("\nnode matrix: not measured ({}; --matrix measures it)\n",
                       o.no_matrix ? "--no-matrix" : "the topology has one NUMA node");
  }
  return node_matrix;
}

// --json: the machine, the options, the bandwidth, the matrix (null when not measured) and the
// notes.
void write_memory_json(std::ofstream& json_file, const BenchMemoryOptions& o,
                       const runtime::DeviceSet& devices, const CheckedMemoryOptions& c,
                       const diagnostics::DeviceBandwidthResult& bandwidth,
                       const std::optional<diagnostics::NodeMatrixResult>& node_matrix,
                       const std::vector<std::string>& notes) {
  nlohmann::json j{{"kind", "numesh bench memory"},
                   {"machine", machine_json(devices)},
                   {"options",
                    {{"size", c.bytes},
                     {"kernels", c.kernel_names},
                     {"threads_sweep", o.threads_sweep},
                     {"repeats", o.repeats},
                     {"min_time", o.min_time},
                     {"latency_size", c.latency_bytes},
                     {"latency_loads", o.latency_loads}}},
                   {"bandwidth", bandwidth.to_json()},
                   {"matrix", node_matrix ? node_matrix->to_json() : nlohmann::json(nullptr)},
                   {"notes", notes}};
  json_file << j.dump(2) << "\n";
}

}  // namespace

CLI::App* add_bench_memory_command(CLI::App& bench, BenchMemoryOptions& o) {
  CLI::App* cmd = bench.add_subcommand(
      "memory",
      "Memory bandwidth of each device (STREAM's read, copy and triad by the device's own "
      "threads on memory of its NUMA node, over a sweep of thread counts) and, on machines with "
      "several NUMA nodes, the device x node read bandwidth and latency matrix.");
  cmd->footer(
      R"(What is measured: each device in turn allocates its arrays (--size each) on its NUMA
node (bound, else placed by first touch of its pinned threads) and runs, inside its oneTBB
arena, one warm-up and at least --repeats timed passes of
  read   s += b[i]               counted as 1 x --size
  copy   a[i] = b[i]             counted as 2 x --size
  triad  a[i] = b[i] + q * c[i]  counted as 3 x --size
STREAM's count: ordinary stores also read each destination line first, which is not counted.
Every result is checked. GB/s = 1e9 bytes per second.

Per-device table: kernel; threads (the pass is split into that many chunks, one per thread;
'*': fewer threads ran it, the machine is oversubscribed); GB/s from the median pass; best
GB/s from the fastest (STREAM's "best rate"); median ms; passes timed. --threads-sweep counts
above a device's threads are left out for it (a note says so); all = every thread.

Node matrix (when the topology has several NUMA nodes; --matrix forces it, --no-matrix skips
it): rows are devices (readers), columns NUMA nodes (where the memory lies). read GB/s: all of
the row's threads read --size on the column's node. latency ns: one of its threads follows a
random cycle over --latency-size there, one dependent load after another (page walks
included). A column marked * has a note (memory placed by first touch rather than bound,
binding impossible, pages found elsewhere); '-' is an entry not measured.

Emulate two NUMA nodes on a one-node machine (pinned devices; node 1's memory is placed by
first touch, and both are the same DRAM; hwloc reports 1 GiB per synthetic node):
  HWLOC_THISSYSTEM=1 HWLOC_SYNTHETIC='numa:2 core:1 pu:1' numesh bench memory --size 256M
Examples:
  numesh bench memory
  numesh bench memory --policy core --kernels read --threads-sweep all --matrix
  numesh bench memory --size 64M --repeats 10 --json memory.json
  scripts/plot_benchmarks.py memory.json --out plots)");
  add_machine_options(*cmd, o.machine, /*with_threads=*/true);
  cmd->add_option("--size", o.size, "Bytes of each array (4K, 64MiB, 1G; a multiple of 64)")
      ->capture_default_str();
  cmd->add_option("--kernels", o.kernels, "Kernels, comma-separated: read, copy, triad")
      ->capture_default_str();
  cmd->add_option("--threads-sweep", o.threads_sweep,
                  "Thread counts per device, comma-separated; all = every thread")
      ->capture_default_str();
  cmd->add_option("--repeats", o.repeats, "At least this many timed passes per figure (median)")
      ->capture_default_str();
  cmd->add_option("--min-time", o.min_time, "And at least this many seconds of timed passes")
      ->capture_default_str();
  auto* matrix =
      cmd->add_flag("--matrix", o.matrix, "Measure the device x node matrix even on one NUMA node");
  auto* no_matrix = cmd->add_flag("--no-matrix", o.no_matrix, "Do not measure the node matrix");
  matrix->excludes(no_matrix);
  no_matrix->excludes(matrix);
  cmd->add_option("--latency-size", o.latency_size, "Bytes of the latency matrix's random cycle")
      ->capture_default_str();
  cmd->add_option("--latency-loads", o.latency_loads, "Dependent loads per timed latency pass")
      ->capture_default_str();
  cmd->add_option("--json", o.json, "Write the results and the machine as JSON to FILE");
  cmd->add_flag("--quiet", o.quiet, "No progress line on stderr");
  return cmd;
}

void run_bench_memory(const BenchMemoryOptions& o, std::ostream& out) {
  // Everything the options decide is checked before a device exists.
  const CheckedMemoryOptions c = check_memory_options(o);
  std::ofstream json_file = open_json_file(o.json);

  const std::shared_ptr<runtime::DeviceSet> devices = make_devices(o.machine);
  const MemorySweeps sweeps = memory_sweeps(*devices, c.sweep, o.threads_sweep);
  const bool matrix = o.matrix || (!o.no_matrix && devices->topology().numa_nodes().size() > 1);
  check_memory_fits(*devices, c, matrix);
  report_memory_setup(o, *devices, c, sweeps.notes, out);

  // The progress line counts every measurement of both parts.
  const std::size_t total = memory_measurement_count(*devices, c, sweeps, matrix);
  std::size_t done = 0;
  const ProgressLine progress(o.quiet);
  diagnostics::MemoryBenchmarkOptions options = memory_benchmark_options(o, c);
  options.progress = [&](const std::string& what) {
    progress.show(fmt::format("[{}/{}] {} ...", ++done, total, what));
  };

  const diagnostics::DeviceBandwidthResult bandwidth =
      measure_memory_bandwidth(*devices, c.bytes, sweeps, options);
  write_bandwidth(bandwidth, out);
  out.flush();
  const std::optional<diagnostics::NodeMatrixResult> node_matrix =
      measure_memory_node_matrix(o, *devices, matrix, options, out);
  if (json_file.is_open())
    write_memory_json(json_file, o, *devices, c, bandwidth, node_matrix, sweeps.notes);
}

}  // namespace numesh::tools
