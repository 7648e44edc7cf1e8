#pragma once

// `numesh bench decode`: decode steps of a dense transformer sharded over the devices, judged
// against the devices' read bandwidth measured in the same run: the weight bytes a step reads
// per second, and their fraction of what the memory delivers. With --sweep-hidden, several
// model sizes (the "decode GB/s vs model size" chart of scripts/plot_benchmarks.py).

#include <cstdint>
#include <iosfwd>
#include <string>

#include "mesh_options.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace numesh::tools {

/// The options of `numesh bench decode`. Every field has a default: the dense 61 M-parameter
/// model (hidden 1024, ffn 4096, 4 layers, 16/4 heads of 64), batch 1, a few seconds.
struct BenchDecodeOptions {
  MeshOptions mesh;                ///< topology, placement, --dims 1,1,-1, --names dp,ep,tp
  std::int64_t batch = 1;          ///< --batch: sequences
  std::int64_t prompt = 16;        ///< --prompt: prefill tokens per sequence before the steps
  std::int64_t steps = 16;         ///< --steps: timed decode steps (median)
  std::int64_t hidden = 1024;      ///< --hidden
  std::int64_t layers = 4;         ///< --layers
  std::int64_t heads = 0;          ///< --heads: 0 = hidden / head_dim
  std::int64_t kv_heads = 0;       ///< --kv-heads: 0 = heads / 4 when 4 divides heads, else heads
  std::int64_t head_dim = 64;      ///< --head-dim
  std::int64_t ffn = 0;            ///< --ffn: 0 = 4 x hidden
  std::int64_t moe_every = 0;      ///< --moe-every: 0 = dense (the default)
  std::int64_t experts = 8;        ///< --experts (MoE blocks only)
  std::int64_t top_k = 2;          ///< --top-k (MoE blocks only)
  std::int64_t moe_ffn = 0;        ///< --moe-ffn: 0 = ffn / top_k
  std::string sweep_hidden;        ///< --sweep-hidden: hidden sizes, comma-separated
  std::string size = "256M";       ///< --size: bytes of the read array per device
  int repeats = 5;                 ///< --repeats: timed read passes (median)
  std::string kv_layout = "bhtd";  ///< --kv-layout
  std::string kv_dtype = "f32";    ///< --kv-dtype f32|bf16|f16
  std::string dtypes =
      "f32";               ///< --dtypes: weight storage dtypes, comma-separated, each its own row
  std::uint32_t seed = 0;  ///< --seed: weights and inputs
  std::string json;        ///< --json FILE
  bool quiet = false;      ///< --quiet: no progress line
};

/// Registers `decode` under the `bench` subcommand. Not thread-safe (CLI11 setup).
CLI::App* add_bench_decode_command(CLI::App& bench, BenchDecodeOptions& options);

/// Measures the read bandwidth, then each model size's decode steps; writes the report to
/// `out` (progress on stderr; the JSON file when asked). Every option and every size's config
/// is checked before anything is measured.
/// Throws: ValueError naming a bad option value or model size; IoError for an unwritable
/// --json file; what the mesh, the lowering and the measurements throw.
void run_bench_decode(const BenchDecodeOptions& options, std::ostream& out);

}  // namespace numesh::tools
