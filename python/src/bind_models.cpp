#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "conversions.hpp"
#include "interrupts.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/progress_line.hpp"
#include "numesh/models/engine/engine.hpp"
#include "numesh/models/engine/model_source.hpp"
#include "numesh/models/lm/generation.hpp"
#include "numesh/models/tokenizers/text_tokenizer.hpp"
#include "numesh/runtime/cancellation.hpp"
#include "numesh/runtime/device.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/topology.hpp"
#include "numesh/sharding/partition_manager.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace numesh::python {

namespace {

// A model loaded onto a mesh (models::Engine), as Python holds it. Not thread-safe, as the
// engine is not: one Python thread at a time drives it (the GIL is released while it computes,
// so the wrapper keeps its own lock against a second thread entering meanwhile).
class CausalLM {
 public:
  explicit CausalLM(models::Engine engine) : engine_(std::move(engine)) {}

  models::Engine& engine() { return engine_; }
  const models::TextTokenizer* tokenizer() const { return engine_.source().tokenizer(); }
  std::mutex& busy() { return busy_; }

 private:
  models::Engine engine_;
  std::mutex busy_;
};

// Token ids from Python: a sequence of ints or a 1-D NumPy array of an integer type (never a
// silent cast from floats). Ids past int32 are refused here; ids outside the vocabulary by the
// model, naming them.
std::vector<std::int32_t> to_ids(py::handle value) {
  std::vector<std::int32_t> ids;
  const auto outside = [](const std::string& id, std::size_t at) {
    return IndexError("token id " + id + " at position " + std::to_string(at) +
                      " is outside the vocabulary");
  };
  // Any integer type: past int32 is outside every vocabulary.
  const auto push = [&](auto id, std::size_t at) {
    if (!std::in_range<std::int32_t>(id)) throw outside(std::to_string(id), at);
    ids.push_back(static_cast<std::int32_t>(id));
  };
  if (py::isinstance<py::array>(value)) {
    const auto array = py::reinterpret_borrow<py::array>(value);
    const char kind = array.dtype().kind();
    if (kind != 'i' && kind != 'u') {
      throw TypeError("token ids are integers; got an array of dtype " +
                      py::str(array.dtype()).cast<std::string>());
    }
    if (array.ndim() != 1) {
      throw ValueError("token ids are a 1-D array; got shape " +
                       py::str(value.attr("shape")).cast<std::string>());
    }
    // Read as the widest integer of the array's signedness, so that no value wraps.
    const auto read = [&](auto zero) {
      using Int = decltype(zero);
      const auto wide = py::array_t<Int, py::array::c_style | py::array::forcecast>(array);
      const auto view = wide.template unchecked<1>();
      for (py::ssize_t i = 0; i < view.shape(0); ++i) push(view(i), static_cast<std::size_t>(i));
    };
    if (kind == 'u') {
      read(std::uint64_t{0});
    } else {
      read(std::int64_t{0});
    }
    return ids;
  }
  if (!py::isinstance<py::list>(value) && !py::isinstance<py::tuple>(value)) {
    throw TypeError("token ids are a list, a tuple or a 1-D NumPy array of ints; got " +
                    py::str(py::type::handle_of(value)).cast<std::string>());
  }
  std::size_t at = 0;
  for (py::handle id : value) {
    if (!py::isinstance<py::int_>(id) || py::isinstance<py::bool_>(id)) {
      throw TypeError("token id at position " + std::to_string(at) + " is " +
                      py::repr(id).cast<std::string>() + " of " +
                      py::str(py::type::handle_of(id)).cast<std::string>() + ", not an int");
    }
    const auto v = index_value(id);  // past int64 is past int32 too
    if (!v) throw outside(py::str(id).cast<std::string>(), at);
    push(*v, at++);
  }
  return ids;
}

std::unique_ptr<CausalLM> from_pretrained(const std::string& path,
                                          const std::optional<std::string>& dtype,
                                          std::optional<runtime::DeviceMesh> mesh,
                                          std::optional<sharding::PartitionAxis> partition_axis,
                                          std::int64_t context, std::int64_t batch,
                                          const std::string& mmap, const std::string& kv_dtype,
                                          std::int64_t prefill_chunk, bool progress) {
  const models::WeightMapping mapping = models::parse_weight_mapping(mmap);
  const DType kv = models::parse_kv_dtype(kv_dtype);
  py::gil_scoped_release release;
  models::ModelSource source = models::ModelSource::open(path);
  models::EngineOptions options;
  // Unset: a GGUF model's matrices as the file stores each (EngineOptions::dtype).
  if (dtype) options.dtype = parse_dtype(*dtype);
  options.context = context;
  options.sequences = batch;
  options.mapping = mapping;
  options.kv_dtype = kv;
  options.prefill_chunk = prefill_chunk;
  if (partition_axis) options.partitions = sharding::PartitionManager(*partition_axis);
  if (!mesh) mesh = default_device_mesh();
  // On stderr, a terminal's only (the callback runs on a load thread, without the GIL).
  const ProgressLine line(!progress);
  if (progress) {
    options.progress = [&line](std::int64_t done, std::int64_t total) {
      line.update(load_progress_text(done, total));
    };
  }
  return std::make_unique<CausalLM>(models::Engine::load(std::move(source), *mesh, options));
}

// True for a batch of id rows: a 2-D array, or a list or tuple whose items are sequences.
bool is_batch(py::handle value) {
  if (py::isinstance<py::array>(value)) return py::reinterpret_borrow<py::array>(value).ndim() == 2;
  if (!py::isinstance<py::list>(value) && !py::isinstance<py::tuple>(value)) return false;
  const auto items = py::reinterpret_borrow<py::sequence>(value);
  return items.size() > 0 && !py::isinstance<py::int_>(items[0]) &&
         (py::isinstance<py::list>(items[0]) || py::isinstance<py::tuple>(items[0]) ||
          py::isinstance<py::array>(items[0]));
}

py::array_t<float> logits(CausalLM& lm, const py::object& ids_in) {
  // One sequence (T ids: [T, vocab]) or the model's batch of rows of equal length ([B, T]:
  // [B, T, vocab]).
  const bool batched = is_batch(ids_in);
  std::vector<std::int32_t> ids;
  std::int64_t rows = 1;
  if (batched) {
    rows = static_cast<std::int64_t>(py::len(ids_in));
    const std::int64_t batch = lm.engine().model().batch();
    if (rows != batch) {
      throw ShapeError("logits: " + std::to_string(rows) + " rows of ids; the model runs " +
                       std::to_string(batch) + " a call (CausalLM.from_pretrained(batch=" +
                       std::to_string(rows) + ") runs " + std::to_string(rows) + ")");
    }
    std::size_t row = 0, length = 0;
    for (py::handle items : ids_in) {
      const std::vector<std::int32_t> one = to_ids(items);
      if (row == 0) length = one.size();
      if (one.size() != length) {
        throw ShapeError("logits: row " + std::to_string(row) + " has " +
                         std::to_string(one.size()) + " ids and row 0 " + std::to_string(length) +
                         "; the rows of a batch are of one length");
      }
      // Named by row and position here: the model would name the place in all the rows.
      const std::int64_t vocab = lm.engine().config().vocab_size;
      for (std::size_t at = 0; at < one.size(); ++at) {
        if (one[at] < 0 || one[at] >= vocab) {
          throw IndexError("token id " + std::to_string(one[at]) + " at row " +
                           std::to_string(row) + ", position " + std::to_string(at) +
                           " is outside the vocabulary of " + std::to_string(vocab));
        }
      }
      ids.insert(ids.end(), one.begin(), one.end());
      ++row;
    }
  } else {
    ids = to_ids(ids_in);
    const std::int64_t batch = lm.engine().model().batch();
    if (batch != 1) {
      throw ShapeError("logits: one row of ids; the model runs " + std::to_string(batch) +
                       " a call (give them as [" + std::to_string(batch) + ", T])");
    }
  }
  const auto tokens = static_cast<std::int64_t>(ids.size()) / rows;
  if (ids.empty()) throw ShapeError("logits: the ids are empty; give at least one token");
  std::optional<runtime::HostTensor> out;
  run_interruptible([&] {
    const std::lock_guard lock(lm.busy());
    out.emplace(lm.engine().model().logits(ids, tokens, 0));
  });
  // The array takes the values without a copy.
  const std::int64_t vocab = static_cast<std::int64_t>(out->data.size()) / (rows * tokens);
  out->shape = batched ? std::vector<std::int64_t>{rows, tokens, vocab}
                       : std::vector<std::int64_t>{tokens, vocab};
  return to_numpy(std::move(*out));
}

py::dict generate(CausalLM& lm, const py::object& prompt, std::int64_t max_new_tokens,
                  double temperature, std::int64_t top_k, double top_p, std::uint64_t seed,
                  const std::optional<std::vector<std::int64_t>>& stop_ids,
                  const std::optional<std::function<void(std::int64_t)>>& on_token) {
  const models::TextTokenizer* tokenizer = lm.tokenizer();
  std::vector<std::int32_t> ids;
  if (py::isinstance<py::str>(prompt)) {
    if (tokenizer == nullptr) {
      throw ValueError("the model at '" + lm.engine().source().path().string() +
                       "' has no tokenizer: give the prompt as token ids");
    }
    ids = tokenizer->encode(prompt.cast<std::string>(), /*add_special_tokens=*/true);
  } else {
    ids = to_ids(prompt);
  }
  if (lm.engine().model().batch() != 1) {
    throw ValueError("generate runs one prompt; this model was loaded with batch=" +
                     std::to_string(lm.engine().model().batch()) + " for batched logits");
  }
  models::GenerationOptions options;
  options.max_new_tokens = max_new_tokens;
  options.stop_ids = stop_ids ? *stop_ids : lm.engine().config().eos_token_ids;
  if (temperature != 0.0) options.sampling = ops::SamplingOptions{temperature, top_k, top_p};
  std::mt19937_64 rng(seed);
  models::GenerationResult result;
  run_interruptible([&] {
    const std::lock_guard lock(lm.busy());
    // Ctrl-C stops a step's graph where it is; each step's token goes to the caller's
    // callback, and a signal the callback's own Python code received raises there.
    result = models::generate(lm.engine().model(), {ids}, options, rng,
                              [&](std::int64_t /*step*/, std::span<const std::int64_t> tokens) {
                                py::gil_scoped_acquire acquire;
                                // Python code of the caller's: its numesh calls are its own.
                                const runtime::CancelShield callers_own;
                                if (PyErr_CheckSignals() != 0) throw py::error_already_set();
                                if (on_token && tokens[0] >= 0) (*on_token)(tokens[0]);
                              });
  });
  py::dict out;
  out["ids"] = result.ids[0];
  out["stop_reason"] = models::to_string(result.stopped[0]);
  if (tokenizer != nullptr) {
    std::vector<std::int32_t> known;
    for (const auto id : result.ids[0]) {
      if (tokenizer->knows(static_cast<std::int32_t>(id)))
        known.push_back(static_cast<std::int32_t>(id));
    }
    out["text"] = tokenizer->decode(known, /*skip_special_tokens=*/true);
  } else {
    out["text"] = py::none();
  }
  return out;
}

}  // namespace

void bind_models(py::module_& m) {
  py::class_<models::TextTokenizer>(m, "Tokenizer",
                                    "A model's tokenizer (tokenizer.json, tokenizer.model or a "
                                    "GGUF file's metadata), as the model's own gives ids.")
      .def(
          "encode",
          [](const models::TextTokenizer& t, const std::string& text, bool add_special_tokens) {
            return t.encode(text, add_special_tokens);
          },
          "text"_a, "add_special_tokens"_a = true,
          "The ids of `text` (with the template's special tokens, BOS, unless told not to).")
      .def(
          "decode",
          [](const models::TextTokenizer& t, const py::object& ids, bool skip_special_tokens) {
            return t.decode(to_ids(ids), skip_special_tokens);
          },
          "ids"_a, "skip_special_tokens"_a = true, "The text of `ids`.")
      .def_property_readonly("vocab_size", &models::TextTokenizer::vocab_size)
      .def_property_readonly("kind",
                             [](const models::TextTokenizer& t) { return std::string(t.kind()); });

  py::class_<CausalLM>(m, "CausalLM", R"pbdoc(
A decoder-only language model (Llama, Mistral, Qwen2/3, their MoE forms, Mixtral) loaded onto a
mesh of the machine's devices. CausalLM.from_pretrained(path) opens a Hugging Face folder
(config.json and safetensors) or a GGUF file.
)pbdoc")
      .def_static("from_pretrained", &from_pretrained, "path"_a, py::kw_only(),
                  "dtype"_a = py::none(), "mesh"_a = py::none(), "partition_axis"_a = py::none(),
                  "context"_a = 0, "batch"_a = 1, "mmap"_a = "auto", "kv_dtype"_a = "f32",
                  "prefill_chunk"_a = models::CausalLm::kDefaultPrefillChunk, "progress"_a = true,
                  R"pbdoc(
Loads the model at `path` onto `mesh` (default: DeviceMesh(), the machine's NUMA devices on tp),
each device reading its own shards. `dtype` is how the devices store the matrices ("f32",
"bf16", "f16", "q8_0", "q4_0", "q5_0", "iq4_nl", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs"; default: a GGUF file's matrices each in
the format the file stores it in, as a Q4_K_M file's Q4_K and Q6_K, else f32; `dtype` then names
the format most of the bytes are in, and repr() each of them).
`partition_axis` lays the layers out (default PartitionAxis()); `context` caps the positions
the caches hold (0: the model's whole context); `batch` is the sequences a call of logits runs
(generate runs one); `mmap` as `--mmap` ("on": matrices stored as the file stores them read its
pages in place, no copy; "off": copied into each device's memory; "auto": on for a machine of one
NUMA node); `kv_dtype` how the KV caches store keys and values ("f32", or "bf16" / "f16" in half
the bytes, as `--kv-dtype`); `prefill_chunk` the most tokens of a sequence one run of the
layers takes (a longer prompt, or logits over more ids, runs in chunks: `--prefill-chunk`);
`progress` shows the load's progress on stderr when it is a terminal ("loading 42% (123 of 290
MB)", cleared when done; nothing in a notebook or a log). The GIL is released while it loads.
)pbdoc")
      .def("logits", &logits, "ids"_a, R"pbdoc(
The logits of every position of `ids` (a list or a 1-D integer array of T token ids), as a
float32 NumPy array [T, vocab_size] that owns its memory; of a batch (a 2-D integer array or a
list of lists, as many rows of T ids as from_pretrained's `batch`), [batch, T, vocab_size].
Each call starts at position 0. Raises IndexError for an id outside the vocabulary (naming it)
or more ids than the context, ShapeError for rows of unequal length or not `batch` of them.
Ctrl-C stops the call where it is and raises KeyboardInterrupt; the model is whole afterwards.
)pbdoc")
      .def("generate", &generate, "prompt"_a, py::kw_only(), "max_new_tokens"_a = 32,
           "temperature"_a = 0.0, "top_k"_a = 40, "top_p"_a = 1.0, "seed"_a = 0,
           "stop_ids"_a = py::none(), "on_token"_a = py::none(), R"pbdoc(
Generates from `prompt` (text, encoded with the model's tokenizer, or token ids): greedy when
`temperature` is 0, else sampled (top_k, top_p, `seed`: the same seed gives the same tokens).
Stops at the model's end-of-sequence ids (or `stop_ids`) or after `max_new_tokens`. Returns
{"ids", "text", "stop_reason"}; `on_token(id)` sees each token as it comes. Ctrl-C stops it
where it is, mid-token, and raises KeyboardInterrupt; the model is whole afterwards.
)pbdoc")
      .def_property_readonly(
          "tokenizer", [](const CausalLM& lm) { return lm.tokenizer(); },
          py::return_value_policy::reference_internal, "The model's tokenizer, or None.")
      .def_property_readonly("vocab_size",
                             [](CausalLM& lm) { return lm.engine().config().vocab_size; })
      .def_property_readonly("max_context",
                             [](CausalLM& lm) { return lm.engine().model().max_len(); })
      .def_property_readonly(
          "dtype", [](CausalLM& lm) { return std::string(to_string(lm.engine().dtype())); })
      .def_property_readonly("mesh", [](CausalLM& lm) { return lm.engine().mesh(); })
      .def_property_readonly("path",
                             [](CausalLM& lm) { return lm.engine().source().path().string(); })
      .def("__repr__", [](CausalLM& lm) {
        return "CausalLM('" + lm.engine().source().path().string() + "', " + lm.engine().formats() +
               ", " + lm.engine().mesh().to_string() + ")";
      });
}

}  // namespace numesh::python
