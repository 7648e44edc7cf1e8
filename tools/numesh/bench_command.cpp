#include "bench_command.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>

#include "numesh/core/check.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/timing.hpp"
#include "numesh/diagnostics/collective_benchmark.hpp"
#include "numesh/runtime/device.hpp"
#include "numesh/runtime/transport.hpp"
#include "parsers.hpp"
#include "render.hpp"

namespace numesh::tools {

CLI::App* add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand(
      "bench", "Measure numesh on this machine: collectives, memory bandwidth, decode steps.");
  bench->require_subcommand(1);
  return bench;
}

CLI::App* add_bench_collectives_command(CLI::App& bench, BenchCollectivesOptions& o) {
  CLI::App* cmd = bench.add_subcommand(
      "collectives",
      "Time each collective on the devices (a 1-D mesh of all of them) against a plain "
      "shared-memory loop with one thread per device and against memcpy, in the same run; "
      "check every result.");
  cmd->footer(R"(Columns: numesh and baseline medians, their ratio (baseline time / numesh time:
above 1 means numesh is faster), the algorithm bandwidth (bytes per device / time) and the
memcpy median for the same bytes. With --chain N every run is N collectives in one graph
(the baseline's threads run the same N), each after every device has rewritten its input by
copying it (as the node producing it would): a decode step meets its collectives that way,
many in one run, and the times are per collective, the rewrite included. --chain 1 times a
whole graph run for each collective, its start and end included. With --dtype bf16 or f16 the same bytes hold twice the
elements; reductions widen them, add in fp32 and round once (the baseline too). Emulate two
pinned NUMA devices on a one-node machine with
  HWLOC_THISSYSTEM=1 HWLOC_SYNTHETIC='numa:2 core:1 pu:1' numesh bench collectives
Examples:
  numesh bench collectives --sizes 64K,64M --ops all-reduce --json out.json
  numesh bench collectives --ops all-reduce,all-gather --sizes 32M --dtype bf16
  numesh bench collectives --sizes 4K,64K --chain 64

Under mpirun every rank makes its devices from the cores it is bound to, and the collectives
run over a mesh of every rank's devices, timed against Open MPI's own (MPI_Allreduce,
MPI_Allgather, MPI_Reduce_scatter_block, MPI_Alltoall) on one buffer per rank; rank 0 prints:
  mpirun -np 2 --bind-to core numesh bench collectives --sizes 64K,64M)");
  add_machine_options(*cmd, o.machine, /*with_threads=*/true);
  cmd->add_option("--ops", o.ops, "Collectives to run, comma-separated")->capture_default_str();
  cmd->add_option("--sizes", o.sizes, "Bytes per device, comma-separated (4K, 64KiB, 1M, 64MiB)")
      ->capture_default_str();
  cmd->add_option("--dtype", o.dtype, "Element type of the buffers: f32, bf16 or f16")
      ->capture_default_str();
  cmd->add_option("--repeats", o.repeats, "At least this many timed runs per case")
      ->capture_default_str();
  cmd->add_option("--min-time", o.min_time, "And at least this many seconds per case")
      ->capture_default_str();
  cmd->add_option("--chain", o.chain,
                  "Collectives per graph run, each after its inputs are rewritten; times are "
                  "per collective")
      ->capture_default_str();
  cmd->add_option("--piece-bytes", o.piece_bytes,
                  "Under mpirun: parts that cross between ranks go in pieces of this many "
                  "bytes, so that one piece is reduced or copied while the next crosses (0: "
                  "whole parts)")
      ->capture_default_str();
  cmd->add_option("--all-reduce", o.all_reduce,
                  "The all-reduce's algorithm: auto, direct (every device reduces all inputs), "
                  "two-stage (reduce-scatter then all-gather) or hierarchical (under mpirun: a "
                  "chain of partial results through the ranks, then the results back; "
                  "docs/distributed.md)")
      ->capture_default_str();
  cmd->add_option("--json", o.json, "Write one JSON record per case to FILE");
  cmd->add_option("--trace", o.trace,
                  "Run each case once more, timed node by node, and write that run as Chrome "
                  "trace JSON (chrome://tracing, Perfetto) to DIR/<collective>-<bytes>.json "
                  "(under mpirun, one file per rank: ...-rank<N>.json)");
  cmd->add_flag("--quiet", o.quiet, "No progress line on stderr");
  return cmd;
}

std::string case_trace_path(const std::string& dir, diagnostics::CollectiveOp op, std::size_t bytes,
                            int rank) {
  const std::string name = fmt::format("{}-{}", diagnostics::to_string(op), bytes);
  const std::string file = rank < 0 ? name + ".json" : fmt::format("{}-rank{}.json", name, rank);
  return (std::filesystem::path(dir) / file).string();
}

void write_run_trace(runtime::CompiledGraph& graph, const std::string& path) {
  graph.set_timing(true);
  graph.run();
  graph.set_timing(false);
  std::ofstream file(path);
  file << graph.chrome_trace() << "\n";
  NUMESH_CHECK(file.good(), IoError, "--trace: cannot write '{}'", path);
}

BenchCollectivesCases parse_bench_collectives(const BenchCollectivesOptions& o) {
  BenchCollectivesCases c;
  for (const std::string& name : parse_items(o.ops))
    c.ops.push_back(diagnostics::parse_collective_op(name));
  for (const std::string& s : parse_items(o.sizes)) c.sizes.push_back(parse_bytes(s));
  c.dtype = parse_dtype(o.dtype);
  NUMESH_CHECK(
      is_element_dtype(c.dtype), ValueError,
      "--dtype {}: collectives move f32, bf16 or f16 elements, not blocks of a weight format",
      o.dtype);
  NUMESH_CHECK(!c.ops.empty(), ValueError, "--ops '{}' names no collective", o.ops);
  NUMESH_CHECK(!c.sizes.empty(), ValueError, "--sizes '{}' names no size", o.sizes);
  NUMESH_CHECK(o.repeats > 0, ValueError, "--repeats {} must be positive", o.repeats);
  NUMESH_CHECK(o.min_time >= 0, ValueError, "--min-time {} must not be negative", o.min_time);
  NUMESH_CHECK(o.chain > 0, ValueError, "--chain {} must be positive", o.chain);
  NUMESH_CHECK(o.trace.empty() || std::filesystem::is_directory(o.trace), IoError,
               "--trace '{}' is not a folder", o.trace);
  c.chain = static_cast<std::size_t>(o.chain);
  try {
    c.piece_bytes = parse_bytes(o.piece_bytes);
  } catch (const ValueError& e) {
    throw ValueError(fmt::format("--piece-bytes: {}", e.what()));
  }
  try {
    c.all_reduce = runtime::parse_all_reduce_algorithm(o.all_reduce);
  } catch (const ValueError& e) {
    throw ValueError(fmt::format("--all-reduce: {}", e.what()));
  }
  return c;
}

void run_bench_collectives(const BenchCollectivesOptions& o, std::ostream& out) {
  if (runtime::launched_ranks() > 1) {
    run_bench_collectives_across_ranks(o, out);
    return;
  }
  const BenchCollectivesCases cases = parse_bench_collectives(o);
  const auto& ops = cases.ops;
  const auto& sizes = cases.sizes;
  const DType dtype = cases.dtype;
  const std::size_t chain = cases.chain;
  std::ofstream json_file;
  if (!o.json.empty()) {
    json_file.open(o.json);
    NUMESH_CHECK(json_file.good(), ValueError, "--json: cannot write '{}'", o.json);
  }

  const std::shared_ptr<runtime::DeviceSet> devices = make_devices(o.machine);
  const auto d = static_cast<int>(devices->size());
  for (std::size_t s : sizes) {
    NUMESH_CHECK(s % (dtype_size(dtype) * devices->size()) == 0, ValueError,
                 "size {} bytes is not a multiple of {} bytes ({}) x {} devices", s,
                 dtype_size(dtype), to_string(dtype), devices->size());
  }
  out << fmt::format("devices: {}", d);
  for (std::size_t i = 0; i < devices->size(); ++i) {
    const auto& dev = devices->device(i);
    out << fmt::format("{} {} (cpus {}, {} threads, {})", i == 0 ? "" : ",", dev.spec().label,
                       dev.spec().cpuset.to_string(), dev.spec().threads,
                       runtime::to_string(dev.pinning()));
  }
  out << fmt::format(
      "\nbuffers: {}{}\nbaseline: plain loop of {} threads (reduce-scatter + all-gather for "
      "all-reduce), memcpy on one thread\n{}\n",
      to_string(dtype),
      dtype == DType::kF32 ? ""
                           : " (reductions widen, add in fp32 and round once; the baseline too)",
      d,
      chain == 1 ? "runs: one collective each (a graph run's start and end included)\n"
                 : fmt::format("runs: {} collectives each, every one after the devices rewrite "
                               "their inputs (a copy); times per collective\n",
                               chain));
  out << fmt::format("all-reduce: {}\n", runtime::to_string(cases.all_reduce));
  out << fmt::format("{:<15} {:>9} {:>12} {:>12} {:>7} {:>10} {:>12}\n", "collective", "bytes",
                     "numesh us", "baseline us", "ratio", "GB/s", "memcpy us");
  out.flush();

  const bool progress = !o.quiet && isatty(STDERR_FILENO) != 0;
  const std::size_t total = ops.size() * sizes.size();
  std::size_t done = 0;
  nlohmann::json records = nlohmann::json::array();
  for (diagnostics::CollectiveOp op : ops) {
    for (std::size_t bytes : sizes) {
      ++done;
      if (!o.quiet) {
        std::fprintf(stderr, "%s[%zu/%zu] %s %s ...%s", progress ? "\r\033[K" : "", done, total,
                     std::string(diagnostics::to_string(op)).c_str(), format_bytes(bytes).c_str(),
                     progress ? "" : "\n");
        std::fflush(stderr);
      }
      // One contender alive at a time: the plain loop's threads spin or yield between its
      // runs, and alive during the graph's timing they took CPU time from its devices.
      double t_graph = 0, t_plain = 0, t_copy = 0;
      {
        diagnostics::GraphCollective graph(runtime::DeviceMesh::create(devices, {-1}, {"x"}), op,
                                           bytes, dtype, chain, runtime::kPipelinePieceBytes,
                                           cases.all_reduce);
        t_graph = median_seconds([&] { graph.run(); }, o.repeats, o.min_time) /
                  static_cast<double>(chain);
        NUMESH_CHECK(graph.check(), Error, "{} of {} on {} devices gave a wrong result",
                     diagnostics::to_string(op), format_bytes(bytes), d);
        if (!o.trace.empty()) write_run_trace(graph.graph(), case_trace_path(o.trace, op, bytes));
      }
      {
        diagnostics::PlainCollective plain(d, op, bytes, dtype, chain);
        t_plain = median_seconds([&] { plain.run(); }, o.repeats, o.min_time) /
                  static_cast<double>(chain);
        NUMESH_CHECK(plain.check(), Error, "the baseline {} of {} gave a wrong result",
                     diagnostics::to_string(op), format_bytes(bytes));
      }
      {
        diagnostics::MemcpyBaseline copy(bytes);
        t_copy = median_seconds([&] { copy.run(); }, o.repeats, o.min_time);
      }
      out << fmt::format("{:<15} {:>9} {:>12.1f} {:>12.1f} {:>7.2f} {:>10.2f} {:>12.1f}\n",
                         diagnostics::to_string(op), format_bytes(bytes), t_graph * 1e6,
                         t_plain * 1e6, t_plain / t_graph,
                         static_cast<double>(bytes) / t_graph / 1e9, t_copy * 1e6);
      out.flush();
      records.push_back({{"name", fmt::format("{}/{}", diagnostics::to_string(op), bytes)},
                         {"collective", std::string(diagnostics::to_string(op))},
                         {"dtype", std::string(to_string(dtype))},
                         {"devices", d},
                         {"chain", chain},
                         {"all_reduce", std::string(runtime::to_string(cases.all_reduce))},
                         {"bytes", bytes},
                         {"median_seconds", t_graph},
                         {"baseline", "plain-loop"},
                         {"baseline_median_seconds", t_plain},
                         {"memcpy_median_seconds", t_copy},
                         {"checked", true}});
    }
  }
  if (!o.quiet && progress) std::fprintf(stderr, "\r\033[K");
  if (json_file.is_open()) json_file << records.dump(2) << "\n";
  if (!o.trace.empty()) {
    out << fmt::format("traces: {}\n",
                       (std::filesystem::path(o.trace) / "<collective>-<bytes>.json").string());
  }
}

}  // namespace numesh::tools
