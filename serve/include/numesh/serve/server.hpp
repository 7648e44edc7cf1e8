#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "numesh/models/chat/chat_template.hpp"
#include "numesh/models/engine/engine_loop.hpp"

// numesh's HTTP server: OpenAI's completions and chat completions APIs and llama-server's
// tokenizer endpoints over an EngineLoop. HTTP (cpp-httplib) lives in one file, http_server.cpp;
// the request and response shapes in openai/. The HTTP threads never touch the model: they submit
// to the engine's thread and read each request's stream.

namespace numesh::serve {

/// How the server listens and what it accepts.
struct ServerOptions {
  /// Interface to bind (127.0.0.1: this machine only).
  std::string host = "127.0.0.1";
  /// Port; 0 picks a free one (Server::bind says which).
  int port = 8080;
  /// HTTP worker threads; each open stream holds one.
  int http_threads = 16;
  /// With a key, every request but GET /health needs `Authorization: Bearer KEY` (else 401).
  std::string api_key;
  /// Bodies past this many bytes get 413.
  std::size_t max_body_bytes = std::size_t{1} << 20;
  /// The model's name in /v1/models and in responses.
  std::string model_name = "numesh";
  /// The template chats are rendered with, in place of the model's (`--chat-template FILE`);
  /// unset: the model's (chat_template.jinja or tokenizer_config.json's).
  std::optional<models::ChatTemplate> chat_template;
};

/// The server. One instance per process and port; listen() blocks until stop().
class Server {
 public:
  /// A server whose every endpoint answers 503 (loading) until attach(): it can bind and say
  /// so while the model loads.
  explicit Server(ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Serves `loop` from now on (which must outlive the server), its model's chat template unless
  /// ServerOptions::chat_template replaces it. Call it once. Thread-safe.
  void attach(models::EngineLoop& loop);
  /// Binds the address and returns the port.
  /// Throws: IoError naming the address when it cannot bind.
  int bind();
  /// Serves until stop() (from another thread or a signal watcher); bind() first. Requests in
  /// flight are answered before it returns.
  void listen();
  /// Stops accepting and makes listen() return once the requests in flight are answered.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace numesh::serve
