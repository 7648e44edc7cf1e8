#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "numesh/core/dtype.hpp"
#include "numesh/core/option_text.hpp"
#include "numesh/models/chat/chat_template.hpp"
#include "numesh/models/engine/engine.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/serve/server.hpp"
#include "numesh/sharding/partition_manager.hpp"

// A model served over HTTP, whole: the checks of the options, the server bound first (503
// while the model loads), the serving engine loaded with its paged caches, then served until
// stopped, the requests in flight answered. `numesh serve` and Python's numesh.serve both run
// one; they differ only in how they are stopped (a signal, a call) and what they print. On a
// mesh that spans ranks, rank 0 runs the Service and the other ranks follow_service.

namespace numesh::serve {

/// How a model is served: the options of `numesh serve` (and of numesh.serve, by the same
/// names), after the mesh and the PartitionAxis were built.
struct ServiceOptions {
  /// A Hugging Face folder (config.json, *.safetensors, a tokenizer) or a GGUF file.
  std::string model;
  /// How the devices store the matrices; unset: a GGUF file's matrices each in its own format
  /// (EngineOptions::dtype), else f32.
  std::optional<DType> dtype;
  /// Lays the layers out, and the mode eformer's semantic axes resolve in.
  sharding::PartitionManager partitions{};
  sharding::ModeArg mode = sharding::Mode::kDecode;
  std::int64_t parallel = 8;         ///< requests running at once (1 to 1024)
  std::int64_t ctx_size = 0;         ///< positions a request may take (0: the model's, <= 4096)
  std::int64_t kv_cache_tokens = 0;  ///< tokens the KV cache holds (0: parallel * ctx_size)
  std::int64_t batch_tokens = 256;   ///< tokens a step computes at most (>= parallel)
  std::int64_t block_size = 16;      ///< tokens per KV cache block (1 to 1024)
  std::int64_t max_queue = 64;       ///< requests waiting at most (1 to 100000); past it, 503
  bool prefix_cache = true;          ///< reuse the cached blocks of a prompt's prefix
  /// A Jinja chat template file rendered in place of the model's (empty: the model's).
  std::string chat_template_file;
  /// The model's id in /v1/models and in responses (empty: its folder's or file's name).
  std::string model_name;
  /// HTTP worker threads, each request holding one while it runs or waits (0: parallel +
  /// max_queue + 8, at most 256).
  int http_threads = 0;
  /// host, port (0: any free one), api_key, max_body_bytes. Its model_name, http_threads and
  /// chat_template are set from the fields above.
  ServerOptions server{};
  /// Told the checkpoint bytes read so far and in all after each matrix.
  models::CausalLm::LoadProgress progress{};
  /// Whether the matrices read the model file's pages in place (models::WeightMapping).
  models::WeightMapping mapping = models::WeightMapping::kAuto;
  /// How the paged KV caches store keys and values: f32, or bf16 / f16 in half the bytes
  /// (models::EngineOptions::kv_dtype).
  DType kv_dtype = DType::kF32;
};

/// A model served over HTTP. The constructor checks the options and binds; load() loads the
/// model and serves it; stop() (from any thread) ends the serving once the requests in flight
/// are answered; the destructor stops, waits and drains. One per port.
class Service {
 public:
  /// Checks `options`, errors naming them as `style` does (--parallel 0, parallel=0), reads and
  /// parses the chat template file, then binds the address and answers 503 (loading) from now.
  /// Throws: ValueError naming a bad option; IoError for a chat template file it cannot read
  /// or an address it cannot bind; models::ChatTemplateError (naming the file and the line)
  /// for a template that does not parse; all before anything loads.
  Service(ServiceOptions options, OptionStyle style);
  ~Service();
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  /// The port it listens on (the one the system chose for port 0).
  [[nodiscard]] int port() const noexcept;
  /// The options as checked (http_threads and model_name filled in).
  [[nodiscard]] const ServiceOptions& options() const noexcept;
  /// Loads the model onto `mesh` with paged caches and serves it from then on. Call it once.
  /// Throws: what opening and loading the model throw (the service then stops).
  void load(runtime::DeviceMesh mesh);
  /// The serving engine. REQUIRES: load() returned.
  [[nodiscard]] const models::Engine& engine() const;
  /// The chat template chats are rendered with (the file's, else the model's), or nullptr when
  /// there is none: /v1/chat/completions then refuses every request. REQUIRES: load() returned.
  [[nodiscard]] const models::ChatTemplate* chat_template() const;
  /// Stops accepting; wait() returns once the requests in flight are answered. Thread-safe.
  void stop();
  /// Blocks until stop() and the requests in flight are answered, then finishes the engine's
  /// work. Returns at once when it already has. On a mesh that spans ranks, a rank that hangs
  /// or cannot be reached stops the service on its own.
  /// Throws: what the server's listening threw; then what ended the engine's loop on its own
  /// (TimeoutError naming a rank that hangs; what a call to the other ranks failed with).
  void wait();
  /// As wait(), for at most `timeout`. Returns true when the service has stopped.
  bool wait_for(std::chrono::milliseconds timeout);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// On ranks 1 and up of a mesh that spans ranks (numesh serve under mpirun): checks `options` as
/// Service's constructor does, loads the model onto `mesh` as Service::load does, then makes
/// the calls rank 0's engine makes (models::follow_engine) until rank 0's service stops.
/// Nothing binds: rank 0 alone answers HTTP. Every rank must be given the same options.
/// Throws: ValueError naming a bad option; what loading and models::follow_engine throw.
void follow_service(ServiceOptions options, OptionStyle style, runtime::DeviceMesh mesh);

}  // namespace numesh::serve
