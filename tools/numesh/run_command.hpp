#pragma once

// `numesh run`: the main job. Builds the mesh from the machine's own topology, compiles a small
// transformer (dense SwiGLU and MoE blocks) with random weights, runs prefill and a stretch of
// decode steps sharded over the mesh, checks every output against the dense reference and
// prints the plan and the throughput.

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "mesh_options.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace numesh::tools {

/// The options of `numesh run`. Every field has a default: a model that runs in seconds.
struct RunOptions {
  MeshOptions mesh;               ///< topology, placement, --dims 1,1,-1, --names dp,ep,tp
  std::string mode = "decode";    ///< --mode: train | prefill | decode
  std::string paxis_json;         ///< --paxis-json FILE
  std::vector<std::string> sets;  ///< --set field=value
  std::int64_t batch = 4;         ///< --batch: sequences
  std::int64_t prompt = 128;      ///< --prompt: prefill tokens per sequence
  std::int64_t steps = 32;        ///< --steps: decode steps (tokens per sequence)
  std::int64_t hidden = 512;
  std::int64_t layers = 4;
  std::int64_t heads = 8;
  std::int64_t kv_heads = 4;
  std::int64_t head_dim = 64;
  std::int64_t ffn = 1536;
  std::int64_t experts = 8;
  std::int64_t top_k = 2;
  std::int64_t moe_ffn = 512;
  std::int64_t moe_every = 2;
  double capacity = 0.0;  ///< --capacity: 0 = dropless
  std::string kv_layout = "bhtd";
  /// Storage dtype of the attention, MLP and expert matrices: f32, bf16 or f16.
  std::string dtype = "f32";
  std::uint32_t seed = 0;
  int repeats = 3;        ///< --repeats: timed prefill runs (median)
  bool no_check = false;  ///< --no-check: skip the dense comparison
  bool plan = false;      ///< --plan: print both programs' full plans
  std::string json;       ///< --json FILE: the summary as JSON
  bool quiet = false;     ///< --quiet: no progress line
};

/// Registers `run`. Not thread-safe (CLI11 setup).
CLI::App* add_run_command(CLI::App& app, RunOptions& options);

/// Runs the job, writes the report to `out`, progress to stderr. Returns 0, or 1 when an
/// output differs from the dense reference beyond the bound.
/// Throws: numesh::Error naming a bad option value (before anything runs).
int run_run(const RunOptions& options, std::ostream& out);

}  // namespace numesh::tools
