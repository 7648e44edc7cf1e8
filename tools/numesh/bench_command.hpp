#pragma once

// `numesh bench`, the group of the benchmark commands, and `numesh bench collectives`: each
// collective on the machine's devices against a plain shared-memory loop and memcpy, measured
// in the same run.

#include <cstddef>
#include <iosfwd>
#include <string>
#include <vector>

#include "mesh_options.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/diagnostics/collective_benchmark.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace numesh::tools {

/// The options of `numesh bench collectives`.
struct BenchCollectivesOptions {
  MachineOptions machine;                                               ///< topology and placement
  std::string ops = "all-reduce,all-gather,reduce-scatter,all-to-all";  ///< --ops
  std::string sizes = "4K,16K,64K,256K,1M,4M,16M,64M";  ///< --sizes (bytes per device)
  std::string dtype = "f32";        ///< --dtype: the buffers' element type (f32, bf16, f16)
  int repeats = 20;                 ///< --repeats: at least this many timed runs per case
  double min_time = 0.2;            ///< --min-time: and at least this many seconds per case
  int chain = 1;                    ///< --chain: collectives per graph run (timed per collective)
  std::string piece_bytes = "4M";   ///< --piece-bytes: pieces of reductions across ranks
  std::string all_reduce = "auto";  ///< --all-reduce: the all-reduce's algorithm
  std::string json;                 ///< --json FILE: one record per case
  std::string trace;                ///< --trace DIR: each case's last run as a Chrome trace
  bool quiet = false;               ///< --quiet: no progress line
};

/// The cases bench collectives options ask for, parsed and checked.
struct BenchCollectivesCases {
  std::vector<diagnostics::CollectiveOp> ops;  ///< --ops
  std::vector<std::size_t> sizes;              ///< --sizes, in bytes per device
  DType dtype = DType::kF32;                   ///< --dtype
  std::size_t chain = 1;                       ///< --chain
  std::size_t piece_bytes = 0;                 ///< --piece-bytes
  runtime::AllReduceAlgorithm all_reduce = runtime::AllReduceAlgorithm::kAuto;  ///< --all-reduce
};

/// Parses and checks the options' cases.
/// Throws: ValueError naming a bad --ops, --sizes, --dtype, --repeats, --min-time, --chain,
/// --piece-bytes or --all-reduce;
/// IoError when --trace names no folder.
BenchCollectivesCases parse_bench_collectives(const BenchCollectivesOptions& options);

/// Registers `bench`, the group of the benchmark subcommands (collectives here, memory and
/// decode in bench_memory.hpp and bench_decode.hpp), and returns it. Not thread-safe (CLI11
/// setup).
CLI::App* add_bench_command(CLI::App& app);

/// Registers `collectives` under `bench`. Not thread-safe (CLI11 setup).
CLI::App* add_bench_collectives_command(CLI::App& bench, BenchCollectivesOptions& options);

/// Runs the benchmark (the cases of numesh/diagnostics/collective_benchmark.hpp, timed with
/// numesh::median_seconds), writes the table to `out` (and the JSON file when asked); progress
/// goes to stderr. Throws: numesh::Error naming a bad value; Error when a result is wrong.
/// Under mpirun with more than one rank, runs run_bench_collectives_across_ranks instead.
void run_bench_collectives(const BenchCollectivesOptions& options, std::ostream& out);

/// Where --trace `dir` puts the trace of case (`op`, `bytes`): DIR/<op>-<bytes>.json, or
/// DIR/<op>-<bytes>-rank<N>.json for rank `rank` >= 0 of a run across ranks.
std::string case_trace_path(const std::string& dir, diagnostics::CollectiveOp op, std::size_t bytes,
                            int rank = -1);

/// Runs `graph` once more with per-node timing and writes that run as Chrome trace JSON
/// (chrome://tracing, Perfetto) to `path`. Collective when the graph spans ranks: every rank
/// calls it. Throws: IoError naming the file when it cannot be written; what the run throws.
void write_run_trace(runtime::CompiledGraph& graph, const std::string& path);

/// The benchmark across the ranks mpirun started (bench_collectives_ranks.cpp): every rank makes
/// its devices from the cores it may use, the mesh is every rank's devices in rank order, and
/// each case times numesh's collective over that mesh against MPI's own on one buffer per rank.
/// Rank 0 writes the table (and the JSON file); the others write nothing.
/// Throws: as run_bench_collectives; ValueError when the ranks were started with different
/// options (naming them); Error when a result is wrong on any rank (naming the rank).
void run_bench_collectives_across_ranks(const BenchCollectivesOptions& options, std::ostream& out);

}  // namespace numesh::tools
