// numesh: the command-line program. Subcommands:
//   numesh resolve ...   semantic axes -> PartitionSpec -> corrected spec -> device layout
//   numesh topology ...  machine (or synthetic/XML) topology -> devices, distances, notes
//   numesh mesh ...      devices -> named mesh: which device sits at which coordinate
//   numesh bench collectives ...  collectives against a plain loop and memcpy
//   numesh bench memory ...       read/copy/triad bandwidth per device, device x node matrix
//   numesh bench decode ...       decode steps of a dense model against the read bandwidth
//   numesh op ...        one layer on .npy weights and inputs: plan, time, check, y.npy
//   numesh run ...       the main job: a sharded transformer, prefill + decode, checked
//   numesh generate ...  greedy or sampled generation from a Hugging Face checkpoint
//   numesh serve ...     an OpenAI-compatible HTTP server, continuous batching over paged caches
//   numesh tokenize ...  a model's tokenizer applied to a text or to ids
//   numesh perplexity .. a model's perplexity over a text file (llama.cpp's way)
//   numesh train ....... train a Hugging Face causal LM (AdamW, CSV log, resumable checkpoints)
//   numesh convert ..... a model written as a GGUF file (llama.cpp's format)
//
// Exit status: 0 on success; 1 when the check of `numesh run` or `numesh op` fails; 2 on any bad
// input (CLI11 parse errors included), reported as one line `numesh: error: ...` on stderr naming
// the offending value.

#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <iostream>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include "bench_command.hpp"
#include "bench_decode.hpp"
#include "bench_memory.hpp"
#include "convert_command.hpp"
#include "generate_command.hpp"
#include "mesh_command.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/kernels/blas_core.hpp"
#include "numesh/runtime/cpu_features.hpp"
#include "numesh/runtime/transport.hpp"
#include "op_command.hpp"
#include "perplexity_command.hpp"
#include "ranks.hpp"
#include "resolve_command.hpp"
#include "run_command.hpp"
#include "serve_command.hpp"
#include "tokenize_command.hpp"
#include "topology_command.hpp"
#include "train_command.hpp"

#ifndef NUMESH_VERSION
#define NUMESH_VERSION "unknown"
#endif

namespace {

constexpr int kBadInput = 2;

// How long a rank whose run stopped because another rank's had (PeerStoppedError) waits before
// it ends every rank itself: the rank that failed first ends them at once, and its error, not
// this rank's echo of it, should be the one printed before they go.
constexpr auto kPeerReportGrace = std::chrono::seconds(2);

// Prints "numesh: error: <message>" and a newline on stderr in one write() where it can. Ranks
// under mpirun share one stderr (a pipe under ctest): a line written in pieces (as `std::cerr <<`
// does, one write a piece) interleaves with another rank's error printed at the same moment, and
// a line of up to PIPE_BUF bytes written at once is never split.
void write_error_line(const std::string& message) {
  const std::string line = fmt::format("numesh: error: {}\n", message);
  std::cerr.flush();
  std::fflush(stderr);
  std::string_view rest = line;
  while (!rest.empty()) {
    const ssize_t written = ::write(STDERR_FILENO, rest.data(), rest.size());
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return;  // stderr closed or full: nothing else to tell the error to
    rest.remove_prefix(static_cast<std::size_t>(written));
  }
}

// Prints the error and returns the exit status of bad input. Under mpirun with more than one
// rank it ends every rank instead (abort_mpi_world), after `grace`: a rank that failed alone and
// returned would leave the others waiting for it in their next collective step, and its own
// MPI_Finalize waiting for them.
int fail(const std::string& message,
         std::chrono::milliseconds grace = std::chrono::milliseconds(0)) {
  write_error_line(message);
  if (numesh::runtime::launched_ranks() > 1) {
    std::this_thread::sleep_for(grace);
    numesh::runtime::abort_mpi_world(kBadInput);
  }
  return kBadInput;
}

// One subcommand: its CLI11 app and what runs it once parsed (its exit status).
struct Command {
  CLI::App* app;
  std::function<int(std::ostream&)> run;
  /// Runs across the ranks mpirun starts (docs/distributed.md); the others refuse more than one.
  bool across_ranks = false;
};

// "bench collectives" for a subcommand of bench, "generate" for a top-level one.
std::string command_name(const CLI::App& app) {
  const CLI::App* parent = app.get_parent();
  if (parent != nullptr && parent->get_parent() != nullptr) {
    return parent->get_name() + " " + app.get_name();
  }
  return app.get_name();
}

// The subcommand that `add(parent, options)` registers and `run(options, std::cout)` runs, with
// its options kept alive as long as the command (CLI11 writes into them while parsing). A run
// function returning nothing exits 0.
template <class Options, class Add, class Run>
Command command(CLI::App& parent, Add add, Run run) {
  auto options = std::make_shared<Options>();
  CLI::App* app = add(parent, *options);
  return {
      app, [options, run](std::ostream& out) -> int {
        if constexpr (std::is_void_v<std::invoke_result_t<Run, const Options&, std::ostream&>>) {
          run(*options, out);
          return 0;
        } else {
          return run(*options, out);
        }
      }};
}

// OpenBLAS set itself up when it loaded, before main, in two ways numesh does not want, and
// the program starts again (once, before any thread or MPI) with the environment that fixes
// them:
// - It chose its kernels: when it chose a core older than this CPU (Debian's 0.3.21 gives an
//   Emerald Rapids its SSE3 Prescott kernels, a quarter of the speed: ops/kernels/blas_core.hpp),
//   OPENBLAS_CORETYPE names the CPU's class, and NUMESH_OPENBLAS_CHOSE says what OpenBLAS had
//   chosen (`numesh topology` prints both; a set NUMESH_OPENBLAS_CHOSE also keeps the restart
//   from happening twice). A caller's own OPENBLAS_CORETYPE is left as it is, and
//   NUMESH_KEEP_OPENBLAS_CORE=1 keeps OpenBLAS's choice (to compute as a process that cannot
//   restart does: the Python package's tests compare the program's results with their own bit
//   for bit).
// - It started a pool of threads, one per core but the caller, which spin on sched_yield for
//   about 2^28 cycles before they sleep: a tenth of a second of a core at every start, taken
//   from the devices' threads (a q8_0 model's load took 0.083 s with the pool, 0.051 s
//   without; docs/benchmarks.md, "Session 36"). numesh calls OpenBLAS on one thread anyway
//   (ops/kernels/blas_gemm.hpp), so OPENBLAS_NUM_THREADS=1 unless the caller set it.
void restart_with_openblas_set_up_for_numesh(char** argv) {
  std::string core;  // OPENBLAS_CORETYPE to set, if any
  const char* keep = std::getenv("NUMESH_KEEP_OPENBLAS_CORE");
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr &&
      !(keep != nullptr && std::string_view(keep) == "1") &&
      std::getenv("NUMESH_OPENBLAS_CHOSE") == nullptr) {
    const std::string chosen = numesh::ops::blas_core();
    core = numesh::ops::blas_core_to_request(chosen, numesh::runtime::cpu_features());
    if (!core.empty() && (setenv("NUMESH_OPENBLAS_CHOSE", chosen.c_str(), 1) != 0 ||
                          setenv("OPENBLAS_CORETYPE", core.c_str(), 1) != 0)) {
      unsetenv("NUMESH_OPENBLAS_CHOSE");  // no half-set environment: `topology` reads both
      return;
    }
  }
  const bool threads = std::getenv("OPENBLAS_NUM_THREADS") == nullptr;
  if (threads && setenv("OPENBLAS_NUM_THREADS", "1", 1) != 0) return;
  if (core.empty() && !threads) return;
  execv("/proc/self/exe", argv);
  // The restart failed (no /proc): go on as OpenBLAS set itself up (`numesh topology` reports
  // its core as its own choice).
  if (!core.empty()) {
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("NUMESH_OPENBLAS_CHOSE");
  }
  if (threads) unsetenv("OPENBLAS_NUM_THREADS");
}

}  // namespace

int main(int argc, char** argv) {
  restart_with_openblas_set_up_for_numesh(argv);
  CLI::App app{"numesh: a NUMA task-graph runtime with eformer-compatible sharding.", "numesh"};
  app.set_version_flag("--version", "numesh " NUMESH_VERSION);
  app.require_subcommand(1);
  namespace t = numesh::tools;
  // The subcommands, in the order --help lists them.
  std::vector<Command> commands;
  commands.push_back(command<t::ResolveOptions>(app, t::add_resolve_command, t::run_resolve));
  commands.push_back(command<t::TopologyOptions>(app, t::add_topology_command, t::run_topology));
  commands.push_back(command<t::MeshCommandOptions>(app, t::add_mesh_command, t::run_mesh));
  CLI::App* bench = t::add_bench_command(app);
  commands.push_back(command<t::BenchCollectivesOptions>(*bench, t::add_bench_collectives_command,
                                                         t::run_bench_collectives));
  commands.back().across_ranks = true;
  commands.push_back(
      command<t::BenchMemoryOptions>(*bench, t::add_bench_memory_command, t::run_bench_memory));
  commands.push_back(
      command<t::BenchDecodeOptions>(*bench, t::add_bench_decode_command, t::run_bench_decode));
  commands.push_back(command<t::OpOptions>(app, t::add_op_command, t::run_op));
  commands.push_back(command<t::RunOptions>(app, t::add_run_command, t::run_run));
  commands.back().across_ranks = true;
  commands.push_back(command<t::GenerateOptions>(app, t::add_generate_command, t::run_generate));
  commands.back().across_ranks = true;
  commands.push_back(command<t::ServeOptions>(app, t::add_serve_command, t::run_serve));
  commands.back().across_ranks = true;
  commands.push_back(command<t::TokenizeOptions>(app, t::add_tokenize_command, t::run_tokenize));
  commands.push_back(
      command<t::PerplexityOptions>(app, t::add_perplexity_command, t::run_perplexity));
  commands.back().across_ranks = true;
  commands.push_back(command<t::TrainOptions>(app, t::add_train_command, t::run_train));
  commands.back().across_ranks = true;
  commands.push_back(command<t::ConvertOptions>(app, t::add_convert_command, t::run_convert));

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help / --version
  } catch (const CLI::ParseError& e) {
    return fail(e.what());
  }

  try {
    for (const Command& c : commands) {
      if (!c.app->parsed()) continue;
      // Every rank of `mpirun -np N` would run a command that does not run across processes
      // on its own, on the same cores, writing the same files: refuse it (issue 35).
      if (const int ranks = numesh::runtime::launched_ranks(); ranks > 1 && !c.across_ranks) {
        return fail(fmt::format(
            "started by mpirun as {} ranks: `numesh {}` does not run across processes yet "
            "(docs/distributed.md; `numesh run`, `generate`, `serve`, `perplexity`, `train` and "
            "`bench collectives` do); run one process, or mpirun -np 1",
            ranks, command_name(*c.app)));
      }
      if (numesh::runtime::launched_ranks() > 1) {
        // Every rank checks that all were given the same options, and rank 0 alone writes.
        (void)t::command_world();
        t::check_options_on_every_rank(*c.app);
        return c.run(t::rank0_stream(std::cout));
      }
      return c.run(std::cout);
    }
  } catch (const numesh::PeerStoppedError& e) {
    return fail(e.what(), kPeerReportGrace);
  } catch (const numesh::Error& e) {
    return fail(e.what());
  } catch (const std::bad_alloc&) {
    // The sizes fit each device's node one by one but not all together (or the system is out
    // of memory): say so instead of aborting.
    return fail(
        "out of memory: the sizes asked for need more memory than this machine gives the process");
  } catch (const std::exception& e) {
    return fail(std::string("internal error: ") + e.what());
  }
  return 0;
}
