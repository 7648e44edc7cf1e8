#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "conversions.hpp"
#include "interrupts.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/progress_line.hpp"
#include "numesh/models/engine/model_source.hpp"
#include "numesh/models/hf/hf_config.hpp"
#include "numesh/models/lm/trainer.hpp"
#include "numesh/ops/lowering/model_axes.hpp"
#include "numesh/ops/optimizer.hpp"
#include "numesh/runtime/device.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/topology.hpp"
#include "numesh/sharding/partition_manager.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace numesh::python {

namespace {

// A causal LM being trained (models::CausalLmTrainer), as `numesh train` builds it. One Python
// thread drives it at a time (the lock stands in for the GIL, released while it computes).
class Trainer {
 public:
  explicit Trainer(models::CausalLmTrainer trainer) : trainer_(std::move(trainer)) {}
  models::CausalLmTrainer& trainer() { return trainer_; }
  std::mutex& busy() { return busy_; }
  std::optional<models::StepStats> last;

 private:
  models::CausalLmTrainer trainer_;
  std::mutex busy_;
};

struct TrainerArgs {
  std::string model;
  std::int64_t batch = 8;
  std::int64_t tokens = 0;
  std::optional<runtime::DeviceMesh> mesh;
  std::optional<sharding::PartitionAxis> partition_axis;
  py::object mode;
  std::string init;
  std::uint32_t seed = 0;
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2, clip = 1.0;
  std::int64_t warmup = 0, total_steps = 1;
  std::string schedule;
  std::string dtype;
  std::optional<double> router_aux_loss_coef;
  bool progress = true;
};

std::unique_ptr<Trainer> make_trainer(const TrainerArgs& a) {
  NUMESH_CHECK(a.init == "checkpoint" || a.init == "random", ValueError,
               "init '{}' is not 'checkpoint' or 'random'", a.init);
  NUMESH_CHECK(a.schedule == "constant" || a.schedule == "cosine", ValueError,
               "schedule '{}' is not 'constant' or 'cosine'", a.schedule);
  NUMESH_CHECK(a.dtype == "f32" || a.dtype == "bf16", ValueError,
               "dtype '{}' is not a compute dtype training takes: f32 or bf16 (weights stay f32)",
               a.dtype);
  models::TrainingOptions options;
  options.batch = a.batch;
  options.tokens = a.tokens;
  options.adamw = ops::AdamWOptions{
      .lr = a.lr, .beta1 = a.beta1, .beta2 = a.beta2, .eps = a.eps, .weight_decay = a.weight_decay};
  options.clip = a.clip;
  options.precision = a.dtype == "bf16" ? ops::MatmulPrecision::kBF16 : ops::MatmulPrecision::kF32;
  if (a.router_aux_loss_coef) options.router_aux_loss_coef = *a.router_aux_loss_coef;
  options.schedule = ops::LearningRateSchedule{
      .lr = a.lr,
      .warmup = a.warmup,
      .total = a.total_steps,
      .kind = a.schedule == "cosine" ? ops::LearningRateSchedule::Kind::kCosine
                                     : ops::LearningRateSchedule::Kind::kConstant};
  options.validate();
  const sharding::ModeArg mode = to_mode_arg(a.mode);
  const sharding::PartitionManager manager(a.partition_axis.value_or(sharding::PartitionAxis{}));
  py::gil_scoped_release release;
  const std::filesystem::path dir = a.model;
  // A Hugging Face folder's config.json, or a GGUF model's metadata.
  const models::HfConfig config = models::ModelSource::open(dir).config();
  const runtime::DeviceMesh mesh = a.mesh ? *a.mesh : default_device_mesh();
  const ops::ModelAxes axes = ops::ModelAxes::resolve(manager, mode, a.batch, config.hidden_size);
  if (a.init == "random") {
    return std::make_unique<Trainer>(
        models::CausalLmTrainer::from_initial_weights(mesh, dir, a.seed, options, axes));
  }
  // On stderr, a terminal's only (the callback runs without the GIL).
  const ProgressLine line(!a.progress);
  return std::make_unique<Trainer>(models::CausalLmTrainer::load(
      mesh, dir, options, axes, [&line](std::int64_t done, std::int64_t total) {
        line.update(load_progress_text(done, total));
      }));
}

// A step's rows: an int32 array [batch, tokens + 1], C-contiguous (read in place, no copy).
double step(Trainer& t, const py::object& rows_in) {
  if (!py::isinstance<py::array>(rows_in)) {
    throw TypeError("Trainer.step takes a NumPy int32 array [batch, tokens + 1]; got " +
                    py::str(py::type::handle_of(rows_in)).cast<std::string>());
  }
  const auto rows = py::reinterpret_borrow<py::array>(rows_in);
  if (!rows.dtype().is(py::dtype::of<std::int32_t>())) {
    throw TypeError("Trainer.step takes int32 ids; got an array of dtype " +
                    py::str(rows.dtype()).cast<std::string>() +
                    " (convert with .astype(np.int32))");
  }
  const models::TrainingOptions& o = t.trainer().options();
  const bool fits = rows.ndim() == 2 && rows.shape(0) == o.batch && rows.shape(1) == o.tokens + 1;
  if (!fits) {
    throw ShapeError("Trainer.step takes rows [" + std::to_string(o.batch) + ", " +
                     std::to_string(o.tokens + 1) + "] (batch, tokens + 1); got shape " +
                     py::str(rows_in.attr("shape")).cast<std::string>());
  }
  if ((rows.flags() & py::array::c_style) == 0) {
    throw ValueError("Trainer.step takes a C-contiguous array; give np.ascontiguousarray(rows)");
  }
  const std::span<const std::int32_t> ids(static_cast<const std::int32_t*>(rows.data()),
                                          static_cast<std::size_t>(rows.size()));
  run_interruptible([&] {
    const std::lock_guard lock(t.busy());
    t.last = t.trainer().step(ids);
  });
  return t.last->loss;
}

}  // namespace

void bind_training(py::module_& m) {
  py::class_<Trainer>(m, "Trainer", R"pbdoc(
Trains a causal LM as `numesh train` does: the model in `model` (a Hugging Face folder: its
config.json, and its safetensors unless init="random"; or a GGUF file: its metadata, and its
weights dequantized to f32, save() writing a Hugging Face folder), batches of `batch` sequences of
`tokens` tokens, AdamW (lr, beta1, beta2, eps, weight_decay) with the global-norm clip `clip`,
a constant or warm-up + cosine schedule over `total_steps`, products in f32 or bf16 (weights,
gradients and AdamW's state stay f32). A folder a save() wrote resumes where it stopped.
`progress` shows the checkpoint's load on stderr when it is a terminal.
)pbdoc")
      .def(py::init([](const std::string& model, std::int64_t batch, std::int64_t tokens,
                       std::optional<runtime::DeviceMesh> mesh,
                       std::optional<sharding::PartitionAxis> partition_axis, py::object mode,
                       std::string init, std::uint32_t seed, double lr, double beta1, double beta2,
                       double eps, double weight_decay, double clip, std::int64_t warmup,
                       std::int64_t total_steps, std::string schedule, std::string dtype,
                       std::optional<double> router_aux_loss_coef, bool progress) {
             TrainerArgs a;
             a.model = model;
             a.batch = batch;
             a.tokens = tokens;
             a.mesh = std::move(mesh);
             a.partition_axis = std::move(partition_axis);
             a.mode = std::move(mode);
             a.init = std::move(init);
             a.seed = seed;
             a.lr = lr;
             a.beta1 = beta1;
             a.beta2 = beta2;
             a.eps = eps;
             a.weight_decay = weight_decay;
             a.clip = clip;
             a.warmup = warmup;
             a.total_steps = total_steps;
             a.schedule = std::move(schedule);
             a.dtype = std::move(dtype);
             a.router_aux_loss_coef = router_aux_loss_coef;
             a.progress = progress;
             return make_trainer(a);
           }),
           "model"_a, py::kw_only(), "batch"_a, "tokens"_a, "mesh"_a = py::none(),
           "partition_axis"_a = py::none(), "mode"_a = "__train__", "init"_a = "checkpoint",
           "seed"_a = 0, "lr"_a = 1e-3, "beta1"_a = 0.9, "beta2"_a = 0.999, "eps"_a = 1e-8,
           "weight_decay"_a = 1e-2, "clip"_a = 1.0, "warmup"_a = 0, "total_steps"_a = 1,
           "schedule"_a = "constant", "dtype"_a = "f32", "router_aux_loss_coef"_a = py::none(),
           "progress"_a = true)
      .def("step", &step, "rows"_a, R"pbdoc(
One update from `rows`, an int32 array [batch, tokens + 1] (inputs are each row's first
`tokens` ids, targets its last): returns the mean cross-entropy. Raises IndexError naming an id
outside the vocabulary and ValueError when the gradients are not finite (the weights are then
left as they were). The GIL is released while it computes. Ctrl-C raises KeyboardInterrupt:
during the forward and backward passes it stops them where they are and the step is not taken
(weights, optimizer state and `steps` as before); once the update has begun, it completes.
)pbdoc")
      .def(
          "save",
          [](Trainer& t, const std::string& dir) {
            py::gil_scoped_release release;
            const std::lock_guard lock(t.busy());
            t.trainer().save(dir);
          },
          "dir"_a,
          "Writes config.json, model.safetensors (f32, Hugging Face names: numesh and "
          "transformers load it) and optimizer.safetensors into `dir`.")
      .def_property_readonly(
          "steps", [](Trainer& t) { return t.trainer().steps(); },
          "Updates made so far (resumed ones included).")
      .def_property_readonly(
          "last_step",
          [](Trainer& t) -> py::object {
            if (!t.last) return py::none();
            return py::dict("step"_a = t.last->step, "loss"_a = t.last->loss, "lr"_a = t.last->lr,
                            "grad_norm"_a = t.last->grad_norm);
          },
          "The last step's step, loss, lr and grad_norm (None before the first).")
      .def_property_readonly("parameter_count",
                             [](Trainer& t) { return t.trainer().parameter_count(); });
}

}  // namespace numesh::python
