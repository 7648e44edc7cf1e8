#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "bindings.hpp"
#include "conversions.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/option_text.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/serve/service.hpp"
#include "numesh/sharding/partition_manager.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace numesh::python {

namespace {

// Blocks until the service stops (stop(), from another thread) or `timeout` seconds pass
// (None: no limit); Ctrl-C stops it, waits for the requests in flight and raises
// KeyboardInterrupt. The GIL is released while it waits, in slices that let signals through.
bool wait(serve::Service& service, std::optional<double> timeout) {
  using Clock = std::chrono::steady_clock;
  const auto until = timeout ? Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                  std::chrono::duration<double>(*timeout))
                             : Clock::time_point::max();
  for (;;) {
    bool stopped = false;
    {
      py::gil_scoped_release release;
      stopped = service.wait_for(std::chrono::milliseconds(100));
    }
    if (stopped) return true;
    if (PyErr_CheckSignals() != 0) {
      service.stop();
      {
        py::gil_scoped_release release;
        service.wait();
      }
      throw py::error_already_set();
    }
    if (Clock::now() >= until) return false;
  }
}

}  // namespace

void bind_serve(py::module_& m) {
  py::class_<serve::Service>(m, "Server", R"pbdoc(
A model served over HTTP with OpenAI's completions and chat completions APIs (numesh.serve
makes one; docs/serving.md has the endpoints). It serves from threads of its own until stop();
`with numesh.serve(...) as server:` stops it at the end of the block.
)pbdoc")
      .def_property_readonly("port", &serve::Service::port,
                             "The port it listens on (the one the system chose for port=0).")
      .def_property_readonly(
          "url",
          [](const serve::Service& s) {
            return "http://" + s.options().server.host + ":" + std::to_string(s.port());
          },
          "http://host:port, the base of its endpoints (/v1/completions, ...).")
      .def_property_readonly(
          "model_name", [](const serve::Service& s) { return s.options().server.model_name; },
          "The model's id in /v1/models and in responses.")
      .def("stop", &serve::Service::stop, py::call_guard<py::gil_scoped_release>(),
           "Stops accepting requests; wait() returns once those in flight are answered.")
      .def("wait", &wait, "timeout"_a = py::none(), R"pbdoc(
Blocks until the server stops (stop() from another thread), at most `timeout` seconds (None: no
limit); returns True when it has stopped. Ctrl-C stops it, answers the requests in flight and
raises KeyboardInterrupt. The GIL is released while it waits.
)pbdoc")
      .def(
          "__enter__", [](serve::Service& s) -> serve::Service& { return s; },
          py::return_value_policy::reference)
      .def("__exit__", [](serve::Service& s, const py::args&) {
        s.stop();
        py::gil_scoped_release release;
        s.wait();
      });

  m.def(
      "serve",
      [](std::string model, std::string host, int port, std::int64_t parallel,
         std::int64_t ctx_size, std::int64_t kv_cache_tokens, std::int64_t batch_tokens,
         std::int64_t block_size, std::int64_t max_queue, bool prefix_cache,
         const std::optional<std::string>& dtype, std::optional<runtime::DeviceMesh> mesh,
         const std::optional<sharding::PartitionAxis>& partition_axis, const py::object& mode,
         std::string api_key, std::string model_name,
         const std::optional<std::string>& chat_template, int http_threads, const std::string& mmap,
         const std::string& kv_dtype) {
        serve::ServiceOptions o{.model = std::move(model),
                                .dtype = std::nullopt,
                                .partitions = sharding::PartitionManager(
                                    partition_axis.value_or(sharding::PartitionAxis{})),
                                .mode = to_mode_arg(mode),
                                .parallel = parallel,
                                .ctx_size = ctx_size,
                                .kv_cache_tokens = kv_cache_tokens,
                                .batch_tokens = batch_tokens,
                                .block_size = block_size,
                                .max_queue = max_queue,
                                .prefix_cache = prefix_cache,
                                .chat_template_file = chat_template.value_or(""),
                                .model_name = std::move(model_name),
                                .http_threads = http_threads,
                                .server = {},
                                .progress = {},
                                .mapping = models::parse_weight_mapping(mmap),
                                .kv_dtype = models::parse_kv_dtype(kv_dtype)};
        if (dtype) o.dtype = parse_dtype(*dtype);
        o.server.host = std::move(host);
        o.server.port = port;
        o.server.api_key = std::move(api_key);
        // Binds and loads with the GIL released: the service's threads never need it.
        py::gil_scoped_release release;
        auto service = std::make_unique<serve::Service>(std::move(o), OptionStyle::kKeyword);
        service->load(mesh ? std::move(*mesh) : default_device_mesh());
        return service;
      },
      "model"_a, py::kw_only(), "host"_a = "127.0.0.1", "port"_a = 8080, "parallel"_a = 8,
      "ctx_size"_a = 0, "kv_cache_tokens"_a = 0, "batch_tokens"_a = 256, "block_size"_a = 16,
      "max_queue"_a = 64, "prefix_cache"_a = true, "dtype"_a = py::none(), "mesh"_a = py::none(),
      "partition_axis"_a = py::none(), "mode"_a = "__autoregressive__", "api_key"_a = "",
      "model_name"_a = "", "chat_template"_a = py::none(), "http_threads"_a = 0, "mmap"_a = "auto",
      "kv_dtype"_a = "f32", R"pbdoc(
Serves the model at `model` (a Hugging Face folder or a GGUF file) over HTTP, as `numesh serve`
does with the same options under the same names (docs/serving.md): OpenAI's /v1/completions and
/v1/chat/completions with continuous batching over paged KV caches on `mesh` (default:
DeviceMesh()), /v1/models, /health, /tokenize, /detokenize, /metrics. Binds, loads (the GIL is
released), and returns the running Server; port=0 picks a free port (Server.port says which).
`dtype`: how the devices store the matrices (default: a GGUF file's matrices each in the
format the file stores it in, else f32); `kv_dtype`: how the paged KV cache stores keys and
values ("f32", or "bf16" / "f16" in half the memory);
`chat_template`: a Jinja file rendered in place of the model's. Raises ValueError naming a bad
option, numesh.IoError for a file it cannot read or an address it cannot bind.
)pbdoc");
}

}  // namespace numesh::python
