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
//   numesh tokenize ...  a model's tokenizer applied to a text or to ids
//   numesh perplexity .. a model's perplexity over a text file (llama.cpp's way)
//   numesh train ....... train a Hugging Face causal LM (AdamW, CSV log, resumable checkpoints)
//
// Exit status: 0 on success; 1 when the check of `numesh run` or `numesh op` fails; 2 on any bad input (CLI11 parse errors included), reported as one
// line `numesh: error: ...` on stderr naming the offending value.

#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>
#include <new>
#include <string>

#include "numesh/core/error.hpp"
#include "bench_command.hpp"
#include "bench_decode.hpp"
#include "bench_memory.hpp"
#include "mesh_command.hpp"
#include "resolve_command.hpp"
#include "op_command.hpp"
#include "generate_command.hpp"
#include "perplexity_command.hpp"
#include "run_command.hpp"
#include "tokenize_command.hpp"
#include "topology_command.hpp"
#include "train_command.hpp"

#ifndef NUMESH_VERSION
#define NUMESH_VERSION "unknown"
#endif

namespace {

constexpr int kBadInput = 2;

int fail(const std::string& message) {
  std::cerr << "numesh: error: " << message << "\n";
  return kBadInput;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"numesh: a NUMA task-graph runtime with eformer-compatible sharding.", "numesh"};
  app.set_version_flag("--version", "numesh " NUMESH_VERSION);
  app.require_subcommand(1);
  numesh::tools::ResolveOptions resolve;
  CLI::App* resolve_cmd = numesh::tools::add_resolve_command(app, resolve);
  numesh::tools::TopologyOptions topology;
  CLI::App* topology_cmd = numesh::tools::add_topology_command(app, topology);
  numesh::tools::MeshCommandOptions mesh;
  CLI::App* mesh_cmd = numesh::tools::add_mesh_command(app, mesh);
  CLI::App* bench = numesh::tools::add_bench_command(app);
  numesh::tools::BenchCollectivesOptions bench_collectives;
  CLI::App* bench_collectives_cmd =
      numesh::tools::add_bench_collectives_command(*bench, bench_collectives);
  numesh::tools::BenchMemoryOptions bench_memory;
  CLI::App* bench_memory_cmd = numesh::tools::add_bench_memory_command(*bench, bench_memory);
  numesh::tools::BenchDecodeOptions bench_decode;
  CLI::App* bench_decode_cmd = numesh::tools::add_bench_decode_command(*bench, bench_decode);
  numesh::tools::OpOptions op;
  CLI::App* op_cmd = numesh::tools::add_op_command(app, op);
  numesh::tools::RunOptions run;
  CLI::App* run_cmd = numesh::tools::add_run_command(app, run);
  numesh::tools::GenerateOptions generate;
  CLI::App* generate_cmd = numesh::tools::add_generate_command(app, generate);
  numesh::tools::TokenizeOptions tokenize;
  CLI::App* tokenize_cmd = numesh::tools::add_tokenize_command(app, tokenize);
  numesh::tools::PerplexityOptions perplexity;
  CLI::App* perplexity_cmd = numesh::tools::add_perplexity_command(app, perplexity);
  numesh::tools::TrainOptions train;
  CLI::App* train_cmd = numesh::tools::add_train_command(app, train);

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help / --version
  } catch (const CLI::ParseError& e) {
    return fail(e.what());
  }

  try {
    if (resolve_cmd->parsed()) numesh::tools::run_resolve(resolve, std::cout);
    if (topology_cmd->parsed()) numesh::tools::run_topology(topology, std::cout);
    if (mesh_cmd->parsed()) numesh::tools::run_mesh(mesh, std::cout);
    if (bench_collectives_cmd->parsed()) {
      numesh::tools::run_bench_collectives(bench_collectives, std::cout);
    }
    if (bench_memory_cmd->parsed()) numesh::tools::run_bench_memory(bench_memory, std::cout);
    if (bench_decode_cmd->parsed()) numesh::tools::run_bench_decode(bench_decode, std::cout);
    if (op_cmd->parsed()) return numesh::tools::run_op(op, std::cout);
    if (run_cmd->parsed()) return numesh::tools::run_run(run, std::cout);
    if (generate_cmd->parsed()) return numesh::tools::run_generate(generate, std::cout);
    if (tokenize_cmd->parsed()) return numesh::tools::run_tokenize(tokenize, std::cout);
    if (perplexity_cmd->parsed()) return numesh::tools::run_perplexity(perplexity, std::cout);
    if (train_cmd->parsed()) return numesh::tools::run_train(train, std::cout);
  } catch (const numesh::Error& e) {
    return fail(e.what());
  } catch (const std::bad_alloc&) {
    // The sizes fit each device's node one by one but not all together (or the system is out
    // of memory): say so instead of aborting.
    return fail("out of memory: the sizes asked for need more memory than this machine gives the process");
  } catch (const std::exception& e) {
    return fail(std::string("internal error: ") + e.what());
  }
  return 0;
}
