#include "numesh/serve/service.hpp"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/models/engine/engine_following.hpp"
#include "numesh/models/engine/engine_loop.hpp"
#include "numesh/models/engine/model_source.hpp"

namespace numesh::serve {

namespace {

// The chat template file, read and parsed now: a missing file or a template that does not parse
// is refused before anything binds or loads, not at the first chat.
std::optional<models::ChatTemplate> read_chat_template(const std::string& path, OptionStyle style) {
  if (path.empty()) return std::nullopt;
  const std::string option = option_name(style, "chat_template");
  std::ifstream file(path, std::ios::binary);
  NUMESH_CHECK(std::filesystem::is_regular_file(path) && file.good(), IoError,
               "{}: cannot read '{}'", option, path);
  std::stringstream text;
  text << file.rdbuf();
  try {
    return models::ChatTemplate::parse(text.str(), path);
  } catch (const models::ChatTemplateError& e) {
    throw models::ChatTemplateError(fmt::format("{}: {}", option, e.what()), e.line());
  }
}

// Checks the options and fills in the defaults that depend on others.
void check(ServiceOptions& o, OptionStyle style) {
  const auto text = [style](std::string_view option, const auto& value) {
    return option_text(style, option, value);
  };
  NUMESH_CHECK(!o.model.empty(), ValueError,
               "{} is required (a Hugging Face folder or a GGUF file)",
               option_name(style, "model"));
  ServerOptions& s = o.server;
  NUMESH_CHECK(s.port >= 0 && s.port <= 65535, ValueError, "{} is not a port",
               text("port", s.port));
  NUMESH_CHECK(o.parallel >= 1 && o.parallel <= 1024, ValueError, "{} must be between 1 and 1024",
               text("parallel", o.parallel));
  NUMESH_CHECK(o.ctx_size >= 0 && o.kv_cache_tokens >= 0, ValueError,
               "{} and {} must not be negative", text("ctx_size", o.ctx_size),
               text("kv_cache_tokens", o.kv_cache_tokens));
  NUMESH_CHECK(o.max_queue >= 1 && o.max_queue <= 100000, ValueError,
               "{} must be between 1 and 100000", text("max_queue", o.max_queue));
  NUMESH_CHECK(o.batch_tokens >= o.parallel, ValueError,
               "{} must be at least {} (every running request decodes in every step)",
               text("batch_tokens", o.batch_tokens), text("parallel", o.parallel));
  NUMESH_CHECK(o.block_size >= 1 && o.block_size <= 1024, ValueError,
               "{} must be between 1 and 1024", text("block_size", o.block_size));
  NUMESH_CHECK(o.http_threads >= 0 && s.max_body_bytes >= 1024, ValueError,
               "{} must not be negative and the body limit {} at least 1024",
               text("http_threads", o.http_threads), s.max_body_bytes);
  // Every request holds a worker from its arrival to its end, waiting ones too: enough for all
  // that may run and wait (past them, the queue's 503), and a few for /health; at most 256
  // (past them, connections wait for a worker).
  s.http_threads =
      o.http_threads > 0
          ? o.http_threads
          : static_cast<int>(std::min<std::int64_t>(o.parallel + o.max_queue + 8, 256));
  s.model_name = o.model_name;
  if (s.model_name.empty()) {
    const std::filesystem::path folder = std::filesystem::path(o.model).lexically_normal();
    s.model_name =
        (folder.has_filename() ? folder.filename() : folder.parent_path().filename()).string();
  }
}

// The engine of `o`, loaded onto `mesh`: the same on every rank of a mesh that spans ranks.
models::Engine load_engine(const ServiceOptions& o, runtime::DeviceMesh mesh) {
  models::ModelSource source = models::ModelSource::open(o.model);
  // Without ctx_size, the model's context up to 4096 (llama-server's default): a long-context
  // model's whole context for every request would book gigabytes of cache.
  const std::int64_t context =
      o.ctx_size > 0 ? o.ctx_size : std::min<std::int64_t>(source.config().max_context(), 4096);
  const std::int64_t kv_tokens = o.kv_cache_tokens > 0 ? o.kv_cache_tokens : o.parallel * context;
  return models::Engine::load(
      std::move(source), std::move(mesh),
      {.dtype = o.dtype,
       .sequences = o.parallel,
       .context = context,
       .partitions = o.partitions,
       .mode = o.mode,
       .progress = o.progress,
       .mapping = o.mapping,
       .kv_dtype = o.kv_dtype,
       .serving = models::ServingOptions{.block_size = o.block_size,
                                         .kv_tokens = kv_tokens,
                                         .batch_tokens = o.batch_tokens,
                                         .max_running = o.parallel,
                                         .max_waiting = o.max_queue,
                                         .candidates = 64,
                                         .prefix_caching = o.prefix_cache}});
}

}  // namespace

struct Service::Impl {
  explicit Impl(ServiceOptions o) : options(std::move(o)), server(options.server) {}

  ServiceOptions options;
  Server server;
  int port = 0;
  std::thread http;
  std::promise<void> listened;  // set when listen() returns (its exception, if it threw)
  std::shared_future<void> done = listened.get_future().share();
  std::optional<models::EngineLoop> loop;
  std::mutex finishing;
  bool finished = false;

  // After listen() returned: the engine's work finished, once. Rethrows what listen() threw,
  // then what ended the engine's loop on its own.
  void finish() {
    {
      const std::lock_guard lock(finishing);
      if (!finished) {
        finished = true;
        if (http.joinable()) http.join();
        if (loop) loop->drain();
      }
    }
    done.get();
    if (loop) {
      if (std::exception_ptr failure = loop->failure()) std::rethrow_exception(failure);
    }
  }
};

Service::Service(ServiceOptions options, OptionStyle style) {
  check(options, style);
  options.server.chat_template = read_chat_template(options.chat_template_file, style);
  impl_ = std::make_unique<Impl>(std::move(options));
  impl_->port = impl_->server.bind();
  impl_->http = std::thread([impl = impl_.get()] {
    try {
      impl->server.listen();
      impl->listened.set_value();
    } catch (...) {
      impl->listened.set_exception(std::current_exception());
    }
  });
}

Service::~Service() {
  stop();
  try {
    impl_->finish();
  } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch): wait() reports it
  }
}

int Service::port() const noexcept { return impl_->port; }

const ServiceOptions& Service::options() const noexcept { return impl_->options; }

void Service::load(runtime::DeviceMesh mesh) {
  try {
    // A loop that ends on its own (a rank of the mesh hangs) stops the server; wait() then
    // throws its error.
    impl_->loop.emplace(load_engine(impl_->options, std::move(mesh)),
                        [impl = impl_.get()] { impl->server.stop(); });
  } catch (...) {
    stop();
    throw;
  }
  impl_->server.attach(*impl_->loop);
}

const models::Engine& Service::engine() const { return impl_->loop->engine(); }

const models::ChatTemplate* Service::chat_template() const {
  const std::optional<models::ChatTemplate>& file = impl_->options.server.chat_template;
  return file ? &*file : engine().source().chat_template();
}

void Service::stop() { impl_->server.stop(); }

void Service::wait() { impl_->finish(); }

bool Service::wait_for(std::chrono::milliseconds timeout) {
  if (impl_->done.wait_for(timeout) != std::future_status::ready) return false;
  impl_->finish();
  return true;
}

void follow_service(ServiceOptions options, OptionStyle style, runtime::DeviceMesh mesh) {
  check(options, style);
  models::Engine engine = load_engine(options, std::move(mesh));
  models::follow_engine(engine);
}

}  // namespace numesh::serve
