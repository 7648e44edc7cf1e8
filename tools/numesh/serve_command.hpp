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
  std::string model;              ///< --model DIR: config.json + *.safetensors (+ tokenizer)
  std::string model_name;         ///< --model-name: the id /v1/models gives (the folder's name)
  std::string chat_template;      ///< --chat-template FILE: Jinja, in place of the model's
  std::string host = "127.0.0.1";
  int port = 8080;
  std::int64_t parallel = 8;  ///< --parallel: requests running at once
  std::int64_t ctx_size = 0;  ///< --ctx-size: positions per request (0: the model's, <= 4096)
  std::int64_t kv_cache_tokens = 0;  ///< --kv-cache-tokens (0: parallel * ctx-size)
  std::int64_t batch_tokens = 256;   ///< --batch-tokens: tokens a step computes at most
  std::int64_t block_size = 16;      ///< --block-size: tokens per KV block
  std::int64_t max_queue = 64;       ///< --max-queue: waiting requests; past it, 503
  bool no_prefix_cache = false;      ///< --no-prefix-cache
  std::string dtype;                 ///< --dtype; empty: the model's own format (GGUF), else f32
  std::string api_key;               ///< --api-key
  int http_threads = 0;              ///< --http-threads (0: parallel + max-queue + 8, <= 256)
  std::int64_t max_body_bytes = 1 << 20;
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
