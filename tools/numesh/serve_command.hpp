#pragma once

// `numesh serve`: a Hugging Face checkpoint behind an OpenAI-compatible HTTP server
// (/v1/completions and /v1/chat/completions, streamed or whole; /v1/models, /health, /tokenize,
// /detokenize, /metrics),
// continuous batching over paged KV caches on the machine's mesh. It binds first, answers 503
// while the model loads, prints the address when ready, and drains on SIGINT or SIGTERM.

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "mesh_options.hpp"
#include "numesh/serve/service.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace numesh::tools {

/// The options of `numesh serve`.
struct ServeOptions {
  MeshOptions mesh;               ///< topology, placement, --dims, --names
  std::string mode = "decode";    ///< --mode: the mode the semantic axes resolve in
  std::string paxis_json;         ///< --paxis-json FILE
  std::vector<std::string> sets;  ///< --set field=value
  std::string dtype;              ///< --dtype; empty: a GGUF model's own formats, else f32
  std::string mmap = "auto";      ///< --mmap auto|on|off (models::WeightMapping)
  std::string kv_dtype = "f32";   ///< --kv-dtype f32|bf16|f16: how the KV caches store
  bool no_prefix_cache = false;   ///< --no-prefix-cache
  /// --model, --model-name, --chat-template, --host, --port, --parallel, --ctx-size,
  /// --kv-cache-tokens, --batch-tokens, --block-size, --max-queue, --api-key, --http-threads
  /// (serve::ServiceOptions's defaults are the command's).
  serve::ServiceOptions service;
  bool quiet = false;  ///< --quiet: no progress on stderr
};

/// Registers `serve`. Not thread-safe (CLI11 setup).
CLI::App* add_serve_command(CLI::App& app, ServeOptions& options);

/// Binds, loads, serves until SIGINT or SIGTERM, drains. Returns 0. Prints a warning on stderr
/// when the model's chat template does not parse and no --chat-template replaces it (chats are
/// refused then; completions are served).
/// Throws: numesh::Error naming a bad option or file, or an address it cannot bind; IoError for
/// a --chat-template file it cannot read, ChatTemplateError (naming the file and the line) for
/// one that does not parse; both before anything binds or loads.
int run_serve(const ServeOptions& options, std::ostream& out);

}  // namespace numesh::tools
