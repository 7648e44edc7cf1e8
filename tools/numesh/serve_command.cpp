#include "serve_command.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <ostream>
#include <sstream>
#include <thread>

#include "bench_common.hpp"
#include "kv_dtype_option.hpp"
#include "mmap_option.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/progress_line.hpp"
#include "numesh/models/chat/chat_template.hpp"
#include "numesh/models/engine/engine.hpp"
#include "numesh/models/engine/engine_loop.hpp"
#include "numesh/models/engine/model_source.hpp"
#include "numesh/serve/server.hpp"
#include "numesh/serve/service.hpp"
#include "parsers.hpp"
#include "paxis_options.hpp"
#include "ranks.hpp"

namespace numesh::tools {

namespace {

// The options serve::Service takes, from the command line's: the mesh, mode and PartitionAxis
// checked first, then the rest by the service (named as flags).
serve::ServiceOptions service_options(const ServeOptions& o) {
  serve::ServiceOptions s = o.service;
  if (!o.dtype.empty()) s.dtype = parse_dtype(o.dtype);
  s.mapping = models::parse_weight_mapping(o.mmap);
  s.kv_dtype = models::parse_kv_dtype(o.kv_dtype);
  check_mesh_options(o.mesh);
  s.mode = parse_run_mode(o.mode);
  s.partitions = sharding::PartitionManager(build_paxis(o.paxis_json, o.sets));
  s.prefix_cache = !o.no_prefix_cache;
  return s;
}

// SIGINT and SIGTERM: the handler (in whichever thread the kernel picks: oneTBB's workers do
// not keep a blocked mask) writes the signal's number to a pipe, and a thread reading it stops
// the server, which then drains; a second signal exits at once. Destroying the watcher ends
// that thread and restores the handlers.
class SignalWatcher {
 public:
  SignalWatcher() {
    NUMESH_CHECK(::pipe(fds_) == 0, IoError, "serve: cannot make a pipe for the signals");
    write_end_ = fds_[1];
    struct sigaction action {};
    action.sa_handler = [](int signal) {
      const auto byte = static_cast<unsigned char>(signal);
      [[maybe_unused]] const ssize_t n = ::write(write_end_, &byte, 1);
    };
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &old_int_);
    sigaction(SIGTERM, &action, &old_term_);
  }
  void start(serve::Service& server) {
    thread_ = std::thread([this, &server] {
      for (;;) {
        unsigned char byte = 0;
        const ssize_t n = ::read(fds_[0], &byte, 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0 || byte == 0) return;  // the watcher is done
        if (caught_ == 0) {
          caught_ = byte;  // the first: stop accepting, drain
          server.stop();
        } else {
          // A second one: stop now, without waiting for the requests in flight.
          std::fprintf(stderr, "numesh serve: signal %d again: stopping without draining\n", byte);
          std::_Exit(128 + byte);
        }
      }
    });
  }
  ~SignalWatcher() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
    const unsigned char end = 0;  // wakes the reader when no signal came
    [[maybe_unused]] const ssize_t n = ::write(fds_[1], &end, 1);
    if (thread_.joinable()) thread_.join();
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;
  [[nodiscard]] int caught() const noexcept { return caught_.load(); }

 private:
  static inline int write_end_ = -1;  // the handler's only state: one server per process
  int fds_[2] = {-1, -1};
  struct sigaction old_int_ {
  }, old_term_{};
  std::thread thread_;
  std::atomic<int> caught_{0};
};

// SIGINT and SIGTERM ignored while it lives (the handlers before it restored after).
class IgnoredStopSignals {
 public:
  IgnoredStopSignals() {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGINT, &ignore, &old_int_);
    sigaction(SIGTERM, &ignore, &old_term_);
  }
  ~IgnoredStopSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  IgnoredStopSignals(const IgnoredStopSignals&) = delete;
  IgnoredStopSignals& operator=(const IgnoredStopSignals&) = delete;

 private:
  struct sigaction old_int_ {
  }, old_term_{};
};

}  // namespace

CLI::App* add_serve_command(CLI::App& app, ServeOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "serve",
      "Serve a Hugging Face checkpoint over HTTP with OpenAI's completions and chat completions "
      "APIs: continuous batching over paged KV caches on the machine's mesh, a request's tokens "
      "independent of what else runs.");
  cmd->footer(
      R"(Endpoints: POST /v1/completions (prompt as text or token ids; max_tokens, temperature,
top_p, top_k, seed, stop, stream, ignore_eos), POST /v1/chat/completions (messages, tools,
chat_template_kwargs, add_generation_prompt, and the same fields; the model's chat template
from chat_template.jinja or tokenizer_config.json, or --chat-template's), GET /v1/models,
GET /health (503 while loading), POST /tokenize, POST /detokenize, GET /metrics (Prometheus).
docs/serving.md has the details.
Examples:
  numesh serve --model ~/models/Llama-3.2-1B-Instruct --dtype bf16 --parallel 8 --ctx-size 4096
  curl -s localhost:8080/v1/completions -H 'Content-Type: application/json' \
       -d '{"prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}'
  curl -s localhost:8080/v1/chat/completions -H 'Content-Type: application/json' \
       -d '{"messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 32}')");
  add_mesh_options(*cmd, o.mesh, /*with_threads=*/true);
  cmd->add_option("--mode", o.mode, "The mode eformer's semantic axes resolve in")
      ->capture_default_str();
  cmd->add_option("--paxis-json", o.paxis_json, "JSON file with PartitionAxis fields");
  cmd->add_option("--set", o.sets, "field=value for one PartitionAxis field, repeatable");
  cmd->add_option("--model", o.service.model,
                  "Folder of a Hugging Face checkpoint (config.json, "
                  "*.safetensors, tokenizer.json or tokenizer.model), or a GGUF file");
  cmd->add_option("--model-name", o.service.model_name,
                  "The model's id in /v1/models and responses (default: the folder's name)");
  cmd->add_option("--chat-template", o.service.chat_template_file,
                  "Jinja chat template file that /v1/chat/completions renders, in place of the "
                  "model's (chat_template.jinja or tokenizer_config.json's chat_template)");
  cmd->add_option("--host", o.service.server.host, "Address to bind (127.0.0.1: this machine only)")
      ->capture_default_str();
  cmd->add_option("--port", o.service.server.port, "Port (0: any free one)")->capture_default_str();
  cmd->add_option("--parallel", o.service.parallel, "Requests running at once")
      ->capture_default_str();
  cmd->add_option("--ctx-size", o.service.ctx_size,
                  "Positions a request may take, prompt and completion (0: the model's context, "
                  "at most 4096)")
      ->capture_default_str();
  cmd->add_option("--kv-cache-tokens", o.service.kv_cache_tokens,
                  "Tokens the KV cache holds over all requests (0: parallel x ctx-size)")
      ->capture_default_str();
  cmd->add_option("--batch-tokens", o.service.batch_tokens,
                  "Tokens a step computes at most: every running request's next token, then "
                  "prompt chunks")
      ->capture_default_str();
  cmd->add_option("--block-size", o.service.block_size, "Tokens per KV cache block")
      ->capture_default_str();
  cmd->add_option("--max-queue", o.service.max_queue,
                  "Requests waiting at most; past it, 503 with Retry-After")
      ->capture_default_str();
  cmd->add_flag("--no-prefix-cache", o.no_prefix_cache,
                "Do not reuse the cached blocks of a prompt's prefix");
  cmd->add_option(
      "--dtype", o.dtype,
      fmt::format("How the devices store the matrices: {} (blocks quantized at load). Default: a "
                  "GGUF file's matrices each in the format the file stores it in (a Q4_K_M "
                  "file's Q4_K and Q6_K), f32 otherwise",
                  dtype_choices()));
  add_mmap_option(*cmd, o.mmap);
  add_kv_dtype_option(*cmd, o.kv_dtype);
  cmd->add_option("--api-key", o.service.server.api_key,
                  "Require 'Authorization: Bearer KEY' on every request but /health");
  cmd->add_option("--http-threads", o.service.http_threads,
                  "HTTP worker threads, each request holding one while it runs or waits (0: "
                  "parallel + max-queue + 8, at most 256)")
      ->capture_default_str();
  cmd->add_flag("--quiet", o.quiet, "No progress on stderr");
  return cmd;
}

int run_serve(const ServeOptions& o, std::ostream& out) {
  serve::ServiceOptions options = service_options(o);
  if (command_world()->rank() != 0) {
    // Under mpirun, ranks 1 and up load their shards and follow rank 0's engine until its
    // service stops. mpirun hands a SIGINT or SIGTERM to every rank: only rank 0's matters (it
    // drains, then tells the others to end), so the others ignore them meanwhile.
    const IgnoredStopSignals ignored;
    serve::follow_service(std::move(options), OptionStyle::kFlag, make_mesh(o.mesh));
    // On stderr, --quiet or not: the one line that says this rank ended with rank 0's service
    // (and was not killed by mpirun).
    std::fprintf(stderr, "numesh serve: rank %d: stopped with rank 0\n", command_world()->rank());
    return 0;
  }
  const ProgressLine line(o.quiet);
  options.progress = [&](std::int64_t done, std::int64_t total) {
    line.update(load_progress_text(done, total));
  };
  // Binds now and answers 503 while the model loads.
  serve::Service service(std::move(options), OptionStyle::kFlag);
  // After the service: destroyed before it, so its thread never stops a service that is gone.
  SignalWatcher signals;
  signals.start(service);
  if (!o.quiet) std::fprintf(stderr, "numesh serve: loading %s ...\n", o.service.model.c_str());
  service.load(make_mesh(o.mesh));
  const models::Engine& e = service.engine();
  const std::string& template_error = e.source().chat_template_error();
  if (o.service.chat_template_file.empty() && !template_error.empty()) {
    // Completions are served; chats are refused with this same error.
    std::fprintf(stderr,
                 "numesh: warning: the model's chat template cannot be used (%s): "
                 "/v1/chat/completions refuses every request; give one with --chat-template "
                 "FILE\n",
                 template_error.c_str());
  }
  const models::ChatTemplate* chat = service.chat_template();
  out << fmt::format(
      "numesh serve: listening on http://{}:{} ({}, {} model, {} weights{}, mesh {}{}; {} requests "
      "at once, {} KV tokens in blocks of {}; chat template: {})\n",
      o.service.server.host, service.port(), o.service.model, to_string(e.config().architecture),
      e.formats(),
      // Shards read from the file's pages in place (--mmap): memory the server does not hold.
      e.model().mapped_bytes() > 0
          ? fmt::format(" ({:.1f} MB read in place from the file, --mmap)",
                        static_cast<double>(e.model().mapped_bytes()) / 1e6)
          : "",
      e.mesh().mesh().repr(),
      e.mesh().ranks() > 1 ? fmt::format(" over {} ranks", e.mesh().ranks()) : "",
      o.service.parallel,
      e.scheduler().pool().blocks() * o.service.block_size - o.service.block_size,
      o.service.block_size, chat != nullptr ? chat->name() : "none");
  out.flush();
  service.wait();  // until a signal stops it (the requests in flight answered)
  out << fmt::format("numesh serve: stopped{}\n",
                     signals.caught() != 0 ? fmt::format(" on signal {}", signals.caught()) : "");
  return 0;
}

}  // namespace numesh::tools
