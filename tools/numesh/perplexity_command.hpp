#pragma once

// `numesh perplexity`: a model's perplexity over a text file, as llama.cpp's llama-perplexity
// computes and reports it (chunks of --context tokens, the second half of each scored).

#include <cstdint>
#include <iosfwd>
#include <string>

#include "mesh_options.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace numesh::tools {

/// The options of `numesh perplexity`.
struct PerplexityOptions {
  MeshOptions mesh;              ///< topology, placement, --dims 1,1,-1, --names dp,ep,tp
  std::string model;             ///< --model DIR: config.json, *.safetensors, a tokenizer
  std::string text_file;         ///< --text-file F
  std::int64_t context = 512;    ///< --context: tokens per chunk
  std::string dtype;             ///< --dtype; empty: a GGUF model's own formats, else f32
  std::string mmap = "auto";     ///< --mmap auto|on|off (models::WeightMapping)
  std::string kv_dtype = "f32";  ///< --kv-dtype f32|bf16|f16: how the KV cache stores
  std::string json;              ///< --json FILE
  bool quiet = false;            ///< --quiet: no per-chunk progress
};

/// Registers `perplexity`. Not thread-safe (CLI11 setup).
CLI::App* add_perplexity_command(CLI::App& app, PerplexityOptions& options);

/// Loads the model, tokenizes the file, runs the chunks and reports. Returns 0.
/// Throws: numesh::Error naming a bad option, file or a text too short for one chunk.
int run_perplexity(const PerplexityOptions& options, std::ostream& out);

}  // namespace numesh::tools
