// The one file that includes httplib.h: the routes, the API key, the error objects and the
// streams of server-sent events. The shapes of requests and responses are OpenAI's
// (openai/completion_request.hpp) and llama-server's for /tokenize and /detokenize.

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "numesh/core/error.hpp"
#include "numesh/serve/server.hpp"
#include "openai/completion_request.hpp"
#include "text_stream.hpp"

// Last: with its OpenSSL, zlib and Brotli support (Debian's build) it brings macros that must
// not reach Eigen's headers, which the ones above include.
#include <httplib.h>

namespace numesh::serve {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr std::chrono::milliseconds kPoll{50};

// Equal strings, in a time that does not depend on where they differ.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

void send_error(httplib::Response& res, int status, const std::string& message,
                const std::string& type, const std::string& param = "") {
  res.status = status;
  res.set_content(openai::error_object(message, type, param).dump(), "application/json");
}

std::int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

const char* finish_reason(const std::optional<models::StopReason>& stopped, bool stop_string) {
  if (stop_string) return "stop";
  return stopped == models::StopReason::kStopId ? "stop" : "length";
}

}  // namespace

struct Accepted;

struct Server::Impl {
  ServerOptions options;
  httplib::Server http;
  std::atomic<models::EngineLoop*> loop{nullptr};
  std::atomic<std::int64_t> next_id{0};
  std::atomic<bool> stop_requested{false}, listening{false};
  std::mutex counts_mutex;
  std::map<int, std::int64_t> responses_by_status;

  explicit Impl(ServerOptions o) : options(std::move(o)) {}

  void routes();
  void completions(const httplib::Request& req, httplib::Response& res);
  // The phases of a completion: the request parsed and submitted (or answered with its error),
  // then the whole response, or the stream of chunks.
  std::optional<Accepted> accept(const httplib::Request& req, httplib::Response& res, bool& stream);
  void respond_whole(const Accepted& a, httplib::Response& res);
  void respond_streamed(Accepted a, httplib::Response& res);
  void metrics(httplib::Response& res);
  // llama-server's /tokenize and /detokenize.
  void tokenize(const httplib::Request& req, httplib::Response& res);
  void detokenize(const httplib::Request& req, httplib::Response& res);
};

// A completion request accepted by the engine: its stream, its text and what its responses
// repeat.
struct Accepted {
  std::shared_ptr<models::RequestStream> stream;
  std::shared_ptr<TextStream> text;
  std::size_t prompt_tokens = 0;
  std::string id, model;
  std::int64_t created = 0;

  // A choice of the response or of a chunk: its text, its token ids (an extension, as
  // llama-server's "tokens": the only output of a model without a tokenizer) and, at the end,
  // why it stopped.
  static json choice(const std::string& piece, const std::vector<std::int32_t>& tokens,
                     const json& finish) {
    return json{{"text", piece},
                {"index", 0},
                {"logprobs", nullptr},
                {"finish_reason", finish},
                {"tokens", tokens}};
  }
  // The response's or the last chunk's usage.
  json usage() const {
    const auto completion = static_cast<std::int64_t>(text->tokens().size());
    return {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion},
            {"total_tokens", static_cast<std::int64_t>(prompt_tokens) + completion}};
  }
  // A response or a chunk holding `choice`.
  json body(json choice_json) const {
    return json{{"id", id},
                {"object", "text_completion"},
                {"created", created},
                {"model", model},
                {"choices", json::array({std::move(choice_json)})}};
  }
};

std::optional<Accepted> Server::Impl::accept(const httplib::Request& req, httplib::Response& res,
                                             bool& stream) {
  models::EngineLoop& engine_loop = *loop.load();
  const models::Engine& engine = engine_loop.engine();
  const models::TextTokenizer* tokenizer = engine.source().tokenizer();
  openai::CompletionRequest r;
  try {
    r = openai::parse_completion(req.body, tokenizer, engine.config().vocab_size,
                                 engine.config().eos_token_ids);
  } catch (const openai::RequestError& e) {
    send_error(res, 400, e.message, "invalid_request_error", e.param);
    return std::nullopt;
  }
  stream = r.stream;
  Accepted a;
  a.prompt_tokens = r.prompt.size();
  models::Submitted sub = engine_loop.submit(std::move(r.prompt), r.options);
  if (sub.busy) {
    res.set_header("Retry-After", "1");
    send_error(res, 503, "the server is busy: its queue of waiting requests is full; retry later",
               "server_busy");
    return std::nullopt;
  }
  if (!sub.stream) {
    send_error(res, 400, sub.error, "invalid_request_error");
    return std::nullopt;
  }
  a.stream = std::move(sub.stream);
  a.text = std::make_shared<TextStream>(tokenizer, r.stop);
  a.id = fmt::format("cmpl-{}", next_id++);
  a.model = options.model_name;
  a.created = unix_time();
  return a;
}

void Server::Impl::respond_whole(const Accepted& a, httplib::Response& res) {
  // Waits for the end (a client that leaves meanwhile is not seen until then; its request runs
  // at most max_tokens).
  std::string all;
  json finish = nullptr;
  std::string failure;
  while (finish.is_null() && failure.empty()) {
    for (const models::RequestStream::Event& e : a.stream->take(kPoll)) {
      if (!e.error.empty()) failure = e.error;
      if (e.token < 0 || !finish.is_null()) continue;
      all += a.text->add(e.token);
      if (a.text->stopped()) {
        a.stream->cancel();
        finish = "stop";
      } else if (e.stopped) {
        all += a.text->finish();
        finish = finish_reason(e.stopped, false);
      }
    }
  }
  if (!failure.empty()) {
    send_error(res, 500, failure, "server_error");
    return;
  }
  json body = a.body(Accepted::choice(all, a.text->tokens(), finish));
  body["usage"] = a.usage();
  res.set_content(body.dump(), "application/json");
}

void Server::Impl::respond_streamed(Accepted a, httplib::Response& res) {
  // Server-sent events: a chunk per piece of text (without a tokenizer, per token), the last
  // with its finish reason and the usage, then [DONE]. A write that fails (the client left)
  // cancels the request.
  res.set_header("Cache-Control", "no-cache");
  const bool per_token = loop.load()->engine().source().tokenizer() == nullptr;
  auto sent = std::make_shared<std::size_t>(0);  // tokens in the chunks so far
  const std::shared_ptr<models::RequestStream> stream = a.stream;
  res.set_chunked_content_provider(
      "text/event-stream",
      [a = std::move(a), per_token, sent](std::size_t, httplib::DataSink& sink) -> bool {
        // cpp-httplib calls this outside its handlers' try: an exception here would end the
        // process, so every one ends this response instead.
        try {
          const auto send = [&](const json& j) {
            const std::string line = "data: " + j.dump() + "\n\n";
            return sink.write(line.data(), line.size());
          };
          // A chunk holds the text and the tokens since the last one.
          const auto chunk = [&](const std::string& piece, const json& finish) {
            const std::vector<std::int32_t>& all = a.text->tokens();
            const std::vector<std::int32_t> fresh(all.begin() + static_cast<std::ptrdiff_t>(*sent),
                                                  all.end());
            *sent = all.size();
            return a.body(Accepted::choice(piece, fresh, finish));
          };
          for (;;) {
            for (const models::RequestStream::Event& e : a.stream->take(kPoll)) {
              if (!e.error.empty()) {
                send(openai::error_object(e.error, "server_error"));
                sink.done();
                return true;
              }
              if (e.token < 0) continue;
              std::string piece = a.text->add(e.token);
              const bool stop_string = a.text->stopped();
              if (stop_string) a.stream->cancel();
              if (e.stopped && !stop_string) piece += a.text->finish();
              if (!stop_string && !e.stopped) {
                if ((!piece.empty() || per_token) && !send(chunk(piece, nullptr))) {
                  a.stream->cancel();
                  return false;
                }
                continue;
              }
              json last = chunk(piece, finish_reason(e.stopped, stop_string));
              last["usage"] = a.usage();
              const std::string done = "data: [DONE]\n\n";
              if (send(last)) sink.write(done.data(), done.size());
              sink.done();
              return true;
            }
            if (!sink.is_writable()) {
              a.stream->cancel();
              return false;
            }
          }
        } catch (const std::exception&) {
          a.stream->cancel();
          return false;
        }
      },
      [stream](bool) { stream->cancel(); });  // the response ended: nothing more is wanted
}

void Server::Impl::completions(const httplib::Request& req, httplib::Response& res) {
  bool streamed = false;
  std::optional<Accepted> a = accept(req, res, streamed);
  if (!a) return;
  if (streamed) {
    respond_streamed(std::move(*a), res);
  } else {
    respond_whole(*a, res);
  }
}

void Server::Impl::metrics(httplib::Response& res) {
  const models::EngineCounts c = loop.load()->counts();
  std::string out;
  const auto metric = [&](const char* name, const char* type, const char* help, double value) {
    out += fmt::format("# HELP numesh_{0} {1}\n# TYPE numesh_{0} {2}\nnumesh_{0} {3}\n", name, help,
                       type, value);
  };
  metric("requests_running", "gauge", "Requests running", static_cast<double>(c.running));
  metric("requests_waiting", "gauge", "Requests waiting", static_cast<double>(c.waiting));
  metric("kv_blocks_used", "gauge", "KV cache blocks held", static_cast<double>(c.blocks_used));
  metric("kv_blocks_free", "gauge", "KV cache blocks free", static_cast<double>(c.blocks_free));
  metric("prompt_tokens_total", "counter", "Prompt tokens computed",
         static_cast<double>(c.prompt_tokens));
  metric("generated_tokens_total", "counter", "Tokens generated",
         static_cast<double>(c.generated_tokens));
  metric("prefix_cache_hit_tokens_total", "counter", "Prompt tokens found in the prefix cache",
         static_cast<double>(c.prefix_hit_tokens));
  metric("steps_total", "counter", "Engine steps", static_cast<double>(c.steps));
  metric("prefill_seconds_total", "counter", "Seconds of steps with prompt tokens",
         c.prefill_seconds);
  metric("decode_seconds_total", "counter", "Seconds of decode-only steps", c.decode_seconds);
  out +=
      "# HELP numesh_http_responses_total HTTP responses by status\n"
      "# TYPE numesh_http_responses_total counter\n";
  {
    const std::lock_guard lock(counts_mutex);
    for (const auto& [status, n] : responses_by_status) {
      out += fmt::format("numesh_http_responses_total{{status=\"{}\"}} {}\n", status, n);
    }
  }
  res.set_content(out, "text/plain; version=0.0.4");
}

void Server::Impl::tokenize(const httplib::Request& req, httplib::Response& res) {
  const models::TextTokenizer* tokenizer = loop.load()->engine().source().tokenizer();
  const json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (!body.is_object() || !body.contains("content") || !body["content"].is_string()) {
    send_error(res, 400, "the body must be {\"content\": TEXT}", "invalid_request_error",
               "content");
    return;
  }
  if (tokenizer == nullptr) {
    send_error(res, 400, "the model has no tokenizer", "invalid_request_error");
    return;
  }
  if (body.contains("add_special") && !body["add_special"].is_boolean()) {
    send_error(res, 400, "'add_special' must be true or false", "invalid_request_error",
               "add_special");
    return;
  }
  const bool special = body.value("add_special", false);
  try {
    res.set_content(
        json{{"tokens", tokenizer->encode(body["content"].get<std::string>(), special)}}.dump(),
        "application/json");
  } catch (const Error& e) {
    send_error(res, 400, e.what(), "invalid_request_error", "content");
  }
}

void Server::Impl::detokenize(const httplib::Request& req, httplib::Response& res) {
  const models::TextTokenizer* tokenizer = loop.load()->engine().source().tokenizer();
  const json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (!body.is_object() || !body.contains("tokens") || !body["tokens"].is_array()) {
    send_error(res, 400, "the body must be {\"tokens\": [ids]}", "invalid_request_error", "tokens");
    return;
  }
  if (tokenizer == nullptr) {
    send_error(res, 400, "the model has no tokenizer", "invalid_request_error");
    return;
  }
  std::vector<std::int32_t> ids;
  for (const json& t : body["tokens"]) {
    const bool id = t.is_number_integer() && t.get<std::int64_t>() >= 0 &&
                    t.get<std::int64_t>() <= std::numeric_limits<std::int32_t>::max() &&
                    tokenizer->knows(t.get<std::int32_t>());
    if (!id) {
      send_error(res, 400, fmt::format("'tokens' holds {}, not a token id", t.dump()),
                 "invalid_request_error", "tokens");
      return;
    }
    ids.push_back(t.get<std::int32_t>());
  }
  res.set_content(json{{"content", tokenizer->decode(ids, /*skip_special_tokens=*/false)}}.dump(),
                  "application/json");
}

void Server::Impl::routes() {
  http.new_task_queue = [threads = options.http_threads] {
    return new httplib::ThreadPool(static_cast<std::size_t>(threads));
  };
  http.set_payload_max_length(options.max_body_bytes);
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (loop.load() == nullptr) {
      send_error(res, 503, "the model is loading", "server_loading");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!options.api_key.empty() &&
        !same_secret(req.get_header_value("Authorization"), "Bearer " + options.api_key)) {
      send_error(res, 401, "invalid or missing API key (Authorization: Bearer KEY)",
                 "authentication_error");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http.set_post_routing_handler([this](const httplib::Request&, httplib::Response& res) {
    const std::lock_guard lock(counts_mutex);
    ++responses_by_status[res.status];
  });
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413) {
      send_error(res, 413, "the request body is too large", "invalid_request_error");
    } else if (res.status == 404) {
      send_error(res, 404, fmt::format("no endpoint {} {}", req.method, req.path),
                 "invalid_request_error");
    } else {
      send_error(res, res.status, fmt::format("HTTP {}", res.status), "invalid_request_error");
    }
  });
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        send_error(res, 500, what, "server_error");
      });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (loop.load() == nullptr) {
      send_error(res, 503, "the model is loading", "server_loading");
      return;
    }
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(json{{"object", "list"},
                         {"data", json::array({{{"id", options.model_name},
                                                {"object", "model"},
                                                {"created", unix_time()},
                                                {"owned_by", "numesh"}}})}}
                        .dump(),
                    "application/json");
  });
  http.Post("/v1/completions",
            [this](const httplib::Request& req, httplib::Response& res) { completions(req, res); });
  http.Post("/v1/chat/completions", [](const httplib::Request&, httplib::Response& res) {
    send_error(res, 501,
               "chat completions are not implemented yet (chat templates); use "
               "/v1/completions",
               "not_implemented_error");
  });
  http.Post("/tokenize",
            [this](const httplib::Request& req, httplib::Response& res) { tokenize(req, res); });
  http.Post("/detokenize",
            [this](const httplib::Request& req, httplib::Response& res) { detokenize(req, res); });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) { metrics(res); });
}

Server::Server(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  impl_->routes();
}

Server::~Server() = default;

void Server::attach(models::EngineLoop& loop) { impl_->loop.store(&loop); }

int Server::bind() {
  const ServerOptions& o = impl_->options;
  if (o.port == 0) {
    const int port = impl_->http.bind_to_any_port(o.host);
    if (port < 0) throw IoError(fmt::format("serve: cannot bind {} (any port)", o.host));
    return port;
  }
  if (!impl_->http.bind_to_port(o.host, o.port)) {
    throw IoError(
        fmt::format("serve: cannot bind {}:{} (in use, or not an address of this "
                    "machine)",
                    o.host, o.port));
  }
  return o.port;
}

void Server::listen() {
  impl_->listening = true;
  if (!impl_->stop_requested) impl_->http.listen_after_bind();
  impl_->listening = false;
}

void Server::stop() {
  // cpp-httplib's stop() does nothing until listen has started running: a stop asked for
  // earlier is remembered (listen() then returns at once) or waits for it to start.
  impl_->stop_requested = true;
  while (impl_->listening && !impl_->http.is_running()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  impl_->http.stop();
}

}  // namespace numesh::serve
