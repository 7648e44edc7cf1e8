#pragma once

// `numesh bench memory`: the memory bandwidth of each device (STREAM's read, copy and triad by
// the device's own threads on memory of its node, swept over thread counts) and, on machines
// with several NUMA nodes, the device x node read bandwidth and latency matrix
// (numesh/diagnostics/memory_benchmark.hpp does the measuring).

#include <cstdint>
#include <iosfwd>
#include <string>

#include "mesh_options.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace numesh::tools {

/// The options of `numesh bench memory`, as given on the command line (checked by
/// run_bench_memory before anything is measured).
struct BenchMemoryOptions {
  MachineOptions machine;                   ///< topology and placement
  std::string size = "512M";                ///< --size: bytes of each array
  std::string kernels = "read,copy,triad";  ///< --kernels
  std::string threads_sweep =
      "1,2,4,all";                    ///< --threads-sweep: counts per device; all = every thread
  int repeats = 5;                    ///< --repeats: timed passes per measurement (median)
  double min_time = 0.0;              ///< --min-time: and at least this many seconds of them
  bool matrix = false;                ///< --matrix: measure the node matrix even on one node
  bool no_matrix = false;             ///< --no-matrix: never measure it
  std::string latency_size = "256M";  ///< --latency-size: bytes of the pointer-chasing list
  std::uint64_t latency_loads = std::uint64_t{1} << 20;  ///< --latency-loads: loads per timed pass
  std::string json;                                      ///< --json FILE
  bool quiet = false;                                    ///< --quiet: no progress line
};

/// Registers `memory` under the `bench` subcommand. Not thread-safe (CLI11 setup).
CLI::App* add_bench_memory_command(CLI::App& bench, BenchMemoryOptions& options);

/// Measures and writes the report to `out` (progress on stderr; the JSON file when asked).
/// Every option is checked, and the arrays against the memory of the devices' nodes, before
/// anything is measured.
/// Throws: ValueError naming a bad option value; IoError for an unwritable --json file; what
/// measure_device_bandwidth and measure_node_matrix throw (Error for a wrong kernel result).
void run_bench_memory(const BenchMemoryOptions& options, std::ostream& out);

}  // namespace numesh::tools
