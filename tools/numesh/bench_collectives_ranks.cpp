// `numesh bench collectives` under mpirun: numesh's collectives over a mesh that spans the
// ranks, against Open MPI's own collectives on the same ranks, timed in the same run
// (docs/distributed.md, docs/benchmarks.md).

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "bench_command.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/diagnostics/collective_benchmark.hpp"
#include "numesh/diagnostics/mpi_collective.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/transport.hpp"
#include "parsers.hpp"
#include "ranks.hpp"
#include "render.hpp"

namespace numesh::tools {

namespace {

using Clock = std::chrono::steady_clock;

// The median time of `run`, run the same number of times on every rank (a run is collective):
// after one warm-up run, each rank asks for enough runs to fill --min-time, and all run the
// largest count asked for. The ranks start together (a barrier) so that no rank's time
// includes waiting for a late one.
double median_across_ranks(runtime::Transport& world, const BenchCollectivesOptions& o,
                           const std::function<void()>& run) {
  world.barrier();
  run();
  const auto start = Clock::now();
  run();
  const double first = std::chrono::duration<double>(Clock::now() - start).count();
  const auto mine = static_cast<std::int64_t>(
      std::max<double>(o.repeats, std::ceil(o.min_time / std::max(first, 1e-9))));
  std::vector<std::int64_t> wanted(static_cast<std::size_t>(world.size()));
  world.all_gather(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(wanted)));
  const std::int64_t runs = *std::max_element(wanted.begin(), wanted.end());
  std::vector<double> times;
  world.barrier();
  for (std::int64_t i = 0; i < runs; ++i) {
    const auto t0 = Clock::now();
    run();
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2),
                   times.end());
  return times[times.size() / 2];
}

}  // namespace

void run_bench_collectives_across_ranks(const BenchCollectivesOptions& o, std::ostream& out) {
  const BenchCollectivesCases cases = parse_bench_collectives(o);
  const auto& ops = cases.ops;
  const auto& sizes = cases.sizes;
  const DType dtype = cases.dtype;
  const std::size_t chain = cases.chain;
  // main() compared the options over the ranks, and `out` writes on rank 0 only.
  const std::shared_ptr<runtime::Transport>& world = command_world();
  const bool writer = world->rank() == 0;
  std::ofstream json_file;
  std::shared_ptr<runtime::DeviceSet> devices;
  on_every_rank(*world, [&] {
    if (writer && !o.json.empty()) {
      json_file.open(o.json);
      NUMESH_CHECK(json_file.good(), ValueError, "--json: cannot write '{}'", o.json);
    }
    devices = make_devices(o.machine);
  });
  const runtime::DeviceMesh mesh = runtime::DeviceMesh::create(devices, world, {-1}, {"x"});
  const auto slots = static_cast<std::size_t>(mesh.size());
  const auto ranks = static_cast<std::size_t>(world->size());
  for (std::size_t s : sizes) {
    NUMESH_CHECK(s % (dtype_size(dtype) * slots) == 0, ValueError,
                 "size {} bytes is not a multiple of {} bytes ({}) x {} devices", s,
                 dtype_size(dtype), to_string(dtype), slots);
    NUMESH_CHECK(s % (dtype_size(dtype) * ranks) == 0, ValueError,
                 "size {} bytes is not a multiple of {} bytes ({}) x {} ranks (MPI's collectives "
                 "split it among the ranks)",
                 s, dtype_size(dtype), to_string(dtype), ranks);
  }
  const bool one_device_each = static_cast<std::int64_t>(world->size()) == mesh.size();
  out << fmt::format("ranks: {} (mpirun), devices: {} ({} on rank 0:", world->size(), slots,
                     devices->size());
  for (std::size_t i = 0; i < devices->size(); ++i) {
    const auto& dev = devices->device(i);
    out << fmt::format("{} {} cpus {}", i == 0 ? "" : ",", dev.spec().label,
                       dev.spec().cpuset.to_string());
  }
  out << fmt::format(
      ")\nbuffers: {}\nbaseline: Open MPI's own collective on one buffer per rank{}\n{}\n",
      to_string(dtype),
      one_device_each ? ""
                      : " (ranks hold several devices here: MPI's figures are per rank, not "
                        "per device)",
      chain == 1 ? "runs: one collective each (a graph run's start and end included)"
                 : fmt::format("runs: {} collectives each; times per collective", chain));
  out << (cases.piece_bytes == 0
              ? std::string("pieces: none (parts cross ranks whole)\n")
              : fmt::format("pieces: parts that cross ranks go in pieces of {}\n",
                            format_bytes(cases.piece_bytes)));
  out << fmt::format("all-reduce: {}\n", runtime::to_string(cases.all_reduce));
  out << fmt::format("{:<15} {:>9} {:>12} {:>12} {:>7} {:>10}\n", "collective", "bytes",
                     "numesh us", "MPI us", "ratio", "GB/s");
  out.flush();

  const bool progress = writer && !o.quiet && isatty(STDERR_FILENO) != 0;
  nlohmann::json records = nlohmann::json::array();
  for (diagnostics::CollectiveOp op : ops) {
    for (std::size_t bytes : sizes) {
      if (progress) {
        std::fprintf(stderr, "\r\033[K%s %s ...", std::string(diagnostics::to_string(op)).c_str(),
                     format_bytes(bytes).c_str());
        std::fflush(stderr);
      }
      double t_graph = 0;
      {
        diagnostics::GraphCollective graph(mesh, op, bytes, dtype, chain, cases.piece_bytes,
                                           cases.all_reduce);
        t_graph = median_across_ranks(*world, o, [&] { graph.run(); }) / static_cast<double>(chain);
        check_on_every_rank(
            *world, graph.check(),
            fmt::format("numesh's {} of {}", diagnostics::to_string(op), format_bytes(bytes)));
        if (!o.trace.empty()) {
          write_run_trace(graph.graph(), case_trace_path(o.trace, op, bytes, world->rank()));
        }
      }
      // MPI reduces f32 only; its copies move any element type.
      std::optional<double> t_mpi;
      const bool reduces = op == diagnostics::CollectiveOp::kAllReduce ||
                           op == diagnostics::CollectiveOp::kReduceScatter;
      if (dtype == DType::kF32 || !reduces) {
        diagnostics::MpiCollective mpi(op, bytes, dtype);
        t_mpi = median_across_ranks(*world, o, [&] { mpi.run(); });
        check_on_every_rank(
            *world, mpi.check(),
            fmt::format("MPI's {} of {}", diagnostics::to_string(op), format_bytes(bytes)));
      }
      out << fmt::format("{:<15} {:>9} {:>12.1f} {:>12} {:>7} {:>10.2f}\n",
                         diagnostics::to_string(op), format_bytes(bytes), t_graph * 1e6,
                         t_mpi ? fmt::format("{:.1f}", *t_mpi * 1e6) : "n/a",
                         t_mpi ? fmt::format("{:.2f}", *t_mpi / t_graph) : "n/a",
                         static_cast<double>(bytes) / t_graph / 1e9);
      out.flush();
      nlohmann::json record = {{"name", fmt::format("{}/{}", diagnostics::to_string(op), bytes)},
                               {"collective", std::string(diagnostics::to_string(op))},
                               {"dtype", std::string(to_string(dtype))},
                               {"ranks", world->size()},
                               {"devices", slots},
                               {"chain", chain},
                               {"piece_bytes", cases.piece_bytes},
                               {"all_reduce", std::string(runtime::to_string(cases.all_reduce))},
                               {"bytes", bytes},
                               {"median_seconds", t_graph},
                               {"baseline", "mpi"},
                               {"checked", true}};
      if (t_mpi) record["baseline_median_seconds"] = *t_mpi;
      records.push_back(std::move(record));
    }
  }
  if (progress) std::fprintf(stderr, "\r\033[K");
  if (json_file.is_open()) json_file << records.dump(2) << "\n";
  if (!o.trace.empty()) {
    out << fmt::format(
        "traces: {} (each rank's own clock, from its run's start)\n",
        (std::filesystem::path(o.trace) / "<collective>-<bytes>-rank<N>.json").string());
  }
}

}  // namespace numesh::tools
