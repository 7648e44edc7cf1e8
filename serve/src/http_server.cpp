// The one file that includes httplib.h: the routes, the API key, the error objects and the
// streams of server-sent events. The shapes of requests and responses are OpenAI's (openai/:
// completion_request.hpp, chat_request.hpp, response.hpp) and llama-server's for /tokenize and
// /detokenize.

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "numesh/core/error.hpp"
#include "numesh/serve/server.hpp"
#include "openai/chat_request.hpp"
#include "openai/completion_request.hpp"
#include "openai/response.hpp"
#include "text_stream.hpp"
#include "web_page.hpp"

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
  // Set by attach() before `loop`: the chat template and the positions a request may take.
  openai::ChatSetup chat;
  std::int64_t max_positions = 0;
  std::atomic<std::int64_t> next_id{0};
  std::atomic<bool> stop_requested{false}, listening{false};
  std::mutex counts_mutex;
  std::map<int, std::int64_t> responses_by_status;

  explicit Impl(ServerOptions o) : options(std::move(o)) {}

  void routes();
  // The two endpoints that generate: the request checked and submitted (or answered with its
  // error), then answered whole or as a stream of chunks.
  std::optional<Accepted> accept_completion(const httplib::Request& req, httplib::Response& res);
  std::optional<Accepted> accept_chat(const httplib::Request& req, httplib::Response& res);
  std::optional<Accepted> submit(std::vector<std::int32_t> prompt,
                                 const openai::GenerationRequest& r, openai::Endpoint endpoint,
                                 httplib::Response& res);
  void respond(std::optional<Accepted> a, httplib::Response& res);
  void respond_whole(const Accepted& a, httplib::Response& res);
  void respond_streamed(Accepted a, httplib::Response& res);
  void metrics(httplib::Response& res);
  // llama-server's /tokenize and /detokenize.
  void tokenize(const httplib::Request& req, httplib::Response& res);
  void detokenize(const httplib::Request& req, httplib::Response& res);
};

// A request accepted by the engine: its stream, its text, its tokens' log-probabilities (when
// it asked), and how its responses are shaped.
struct Accepted {
  std::shared_ptr<models::RequestStream> stream;
  std::shared_ptr<TextStream> text;
  std::shared_ptr<std::vector<models::TokenLogprobs>> scores;
  const models::TextTokenizer* tokenizer = nullptr;
  std::size_t prompt_tokens = 0;
  bool streamed = false;
  openai::ResponseShape shape;

  // The response's or the last chunk's usage.
  [[nodiscard]] json usage() const { return openai::usage(prompt_tokens, text->tokens().size()); }
  // Takes in what an event brings beside its token.
  void record(const models::RequestStream::Event& e) const {
    if (e.logprobs) scores->push_back(*e.logprobs);
  }
  // The logprobs of the tokens [from, from + count) (null when the request asked for none);
  // `offset` is the first one's place in the text, in characters, and moves past them.
  [[nodiscard]] json logprobs(std::size_t from, std::size_t count, std::size_t& offset) const {
    if (scores->empty()) return nullptr;
    const std::vector<std::int32_t>& all = text->tokens();
    const std::size_t end = std::min({from + count, all.size(), scores->size()});
    const std::vector<std::int32_t> tokens(all.begin() + static_cast<std::ptrdiff_t>(from),
                                           all.begin() + static_cast<std::ptrdiff_t>(end));
    const std::vector<models::TokenLogprobs> part(
        scores->begin() + static_cast<std::ptrdiff_t>(from),
        scores->begin() + static_cast<std::ptrdiff_t>(end));
    // A token's own text; a model without a tokenizer names ids as vLLM does ("token_id:N").
    const auto text_of = [this](std::int32_t id) {
      return tokenizer != nullptr && tokenizer->knows(id)
                 ? tokenizer->decode(std::vector<std::int32_t>{id}, /*skip_special_tokens=*/false)
                 : fmt::format("token_id:{}", id);
    };
    json out = shape.logprobs(tokens, part, text_of, offset);
    if (out.contains("text_offset")) {
      for (const std::int32_t t : tokens) {
        const std::string s = text_of(t);
        offset += static_cast<std::size_t>(
            std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
      }
    }
    return out;
  }
};

std::optional<Accepted> Server::Impl::accept_completion(const httplib::Request& req,
                                                        httplib::Response& res) {
  const models::Engine& engine = loop.load()->engine();
  openai::CompletionRequest r;
  try {
    r = openai::parse_completion(req.body, engine.source().tokenizer(), engine.config().vocab_size,
                                 engine.config().eos_token_ids);
  } catch (const openai::RequestError& e) {
    send_error(res, 400, e.message, "invalid_request_error", e.param);
    return std::nullopt;
  }
  return submit(std::move(r.prompt), r, openai::Endpoint::kCompletions, res);
}

std::optional<Accepted> Server::Impl::accept_chat(const httplib::Request& req,
                                                  httplib::Response& res) {
  const models::Engine& engine = loop.load()->engine();
  const models::TextTokenizer* tokenizer = engine.source().tokenizer();
  openai::ChatRequest r;
  std::vector<std::int32_t> prompt;
  try {
    r = openai::parse_chat(req.body, engine.config().eos_token_ids);
    if (tokenizer == nullptr) openai::refuse("", "the model has no tokenizer");
    // Rendered and encoded on this worker, as a completion's prompt is encoded: the engine's
    // thread only steps.
    prompt = openai::chat_prompt(chat, r, *tokenizer);
  } catch (const openai::RequestError& e) {
    send_error(res, 400, e.message, "invalid_request_error", e.param);
    return std::nullopt;
  }
  if (r.options.max_new_tokens == 0) {
    r.options.max_new_tokens = openai::default_max_tokens(max_positions, prompt.size());
  }
  return submit(std::move(prompt), r, openai::Endpoint::kChatCompletions, res);
}

std::optional<Accepted> Server::Impl::submit(std::vector<std::int32_t> prompt,
                                             const openai::GenerationRequest& r,
                                             openai::Endpoint endpoint, httplib::Response& res) {
  Accepted a;
  a.prompt_tokens = prompt.size();
  models::Submitted sub = loop.load()->submit(std::move(prompt), r.options);
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
  a.tokenizer = loop.load()->engine().source().tokenizer();
  a.text = std::make_shared<TextStream>(a.tokenizer, r.stop);
  a.scores = std::make_shared<std::vector<models::TokenLogprobs>>();
  a.streamed = r.stream;
  const char* prefix = endpoint == openai::Endpoint::kChatCompletions ? "chatcmpl" : "cmpl";
  a.shape = openai::ResponseShape{.endpoint = endpoint,
                                  .id = fmt::format("{}-{}", prefix, next_id++),
                                  .model = options.model_name,
                                  .created = unix_time()};
  return a;
}

void Server::Impl::respond(std::optional<Accepted> a, httplib::Response& res) {
  if (!a) return;  // answered with its error
  if (a->streamed) {
    respond_streamed(std::move(*a), res);
  } else {
    respond_whole(*a, res);
  }
}

void Server::Impl::respond_whole(const Accepted& a, httplib::Response& res) {
  // Waits for the end (a client that leaves meanwhile is not seen until then; its request runs
  // at most max_tokens).
  std::string all;
  const char* finish = nullptr;
  std::string failure;
  while (finish == nullptr && failure.empty()) {
    for (const models::RequestStream::Event& e : a.stream->take(kPoll)) {
      if (!e.error.empty()) failure = e.error;
      if (e.token < 0 || finish != nullptr) continue;
      a.record(e);
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
  std::size_t offset = 0;
  const json logprobs = a.logprobs(0, a.text->tokens().size(), offset);
  res.set_content(a.shape.whole(all, a.text->tokens(), finish, a.usage(), logprobs).dump(),
                  "application/json");
}

namespace {

// One streamed response: its request's events as server-sent events, a chunk per piece of text
// (without a tokenizer, per token), the closing chunks with the finish reason and the usage,
// then [DONE]. A write that fails (the client left) cancels the request.
class EventSource {
 public:
  EventSource(Accepted a, bool per_token) : a_(std::move(a)), per_token_(per_token) {}

  // cpp-httplib's content provider: writes the stream to its end. False: the client is gone.
  bool write(httplib::DataSink& sink) {
    if (!opened_) {
      opened_ = true;
      for (const json& chunk : a_.shape.opening()) {
        if (!send(sink, chunk)) return gone();
      }
    }
    for (;;) {
      for (const models::RequestStream::Event& e : a_.stream->take(kPoll)) {
        if (!e.error.empty()) {
          send(sink, openai::error_object(e.error, "server_error"));
          sink.done();
          return true;
        }
        if (e.token < 0) continue;
        a_.record(e);
        std::string piece = a_.text->add(e.token);
        const bool stop_string = a_.text->stopped();
        if (stop_string) a_.stream->cancel();
        if (e.stopped && !stop_string) piece += a_.text->finish();
        if (stop_string || e.stopped) {
          return close(sink, piece, finish_reason(e.stopped, stop_string));
        }
        if (!piece.empty() || per_token_) {
          const std::size_t from = sent_;
          std::vector<std::int32_t> tokens = fresh();
          const json logprobs = a_.logprobs(from, tokens.size(), offset_);
          if (!send(sink, a_.shape.piece(piece, tokens, logprobs))) return gone();
        }
      }
      if (!sink.is_writable()) return gone();
    }
  }
  // The client is gone or the response ended early: nothing more is wanted.
  bool gone() {
    a_.stream->cancel();
    return false;
  }

 private:
  static bool send(httplib::DataSink& sink, const json& j) {
    const std::string line = "data: " + j.dump() + "\n\n";
    return sink.write(line.data(), line.size());
  }
  bool close(httplib::DataSink& sink, const std::string& piece, const char* finish) {
    bool sent = true;
    const std::size_t from = sent_;
    std::vector<std::int32_t> tokens = fresh();
    const json logprobs = a_.logprobs(from, tokens.size(), offset_);
    for (const json& chunk : a_.shape.closing(piece, tokens, finish, a_.usage(), logprobs)) {
      sent = sent && send(sink, chunk);
    }
    const std::string done = "data: [DONE]\n\n";
    if (sent) sink.write(done.data(), done.size());
    sink.done();
    return true;
  }
  // The tokens since the last chunk: a chunk holds those it adds.
  std::vector<std::int32_t> fresh() {
    const std::vector<std::int32_t>& all = a_.text->tokens();
    std::vector<std::int32_t> out(all.begin() + static_cast<std::ptrdiff_t>(sent_), all.end());
    sent_ = all.size();
    return out;
  }

  Accepted a_;
  bool per_token_;
  bool opened_ = false;
  std::size_t sent_ = 0;    // tokens in the chunks so far
  std::size_t offset_ = 0;  // characters of their texts (a completion's text_offset)
};

}  // namespace

void Server::Impl::respond_streamed(Accepted a, httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  const bool per_token = loop.load()->engine().source().tokenizer() == nullptr;
  const std::shared_ptr<models::RequestStream> stream = a.stream;
  auto source = std::make_shared<EventSource>(std::move(a), per_token);
  res.set_chunked_content_provider(
      "text/event-stream",
      [source](std::size_t, httplib::DataSink& sink) -> bool {
        // cpp-httplib calls this outside its handlers' try: an exception here would end the
        // process, so every one ends this response instead.
        try {
          return source->write(sink);
        } catch (const std::exception&) {
          return source->gone();
        }
      },
      [stream](bool) { stream->cancel(); });  // the response ended: nothing more is wanted
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
    // /health and the page (GET /: it holds no secret and shows the loading itself) are open:
    // no 503 while loading, no API key; every call the page makes needs them.
    if (req.path == "/health" || req.path == "/") {
      return httplib::Server::HandlerResponse::Unhandled;
    }
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
  http.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_header("Cache-Control", "no-cache");
    res.set_header("Content-Security-Policy", std::string(web_page_policy()));
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_content(web_page().data(), web_page().size(), "text/html; charset=utf-8");
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
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    respond(accept_completion(req, res), res);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    respond(accept_chat(req, res), res);
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

void Server::attach(models::EngineLoop& loop) {
  const models::Engine& engine = loop.engine();
  const std::optional<models::ChatTemplate>& own = impl_->options.chat_template;
  impl_->chat = openai::chat_setup(engine.source(), own ? &*own : nullptr);
  // A request's prompt and completion take at most the context, and the cache's blocks (block 0
  // is the padding's).
  const models::Scheduler& s = engine.scheduler();
  impl_->max_positions =
      std::min(s.options().max_context, (s.pool().blocks() - 1) * s.options().block_size);
  impl_->loop.store(&loop);  // last: the handlers read the above once they see the loop
}

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
