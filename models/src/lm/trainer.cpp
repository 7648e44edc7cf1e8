#include "numesh/models/lm/trainer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <list>
#include <map>
#include <utility>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/timing.hpp"
#include "numesh/models/formats/safetensors.hpp"
#include "numesh/models/formats/safetensors_checkpoint.hpp"
#include "numesh/models/formats/safetensors_writer.hpp"
#include "numesh/models/hf/gguf_checkpoint.hpp"
#include "numesh/models/hf/random_model.hpp"
#include "numesh/runtime/cancellation.hpp"

namespace numesh::models {

namespace {

constexpr std::string_view kOptimizerFile = "optimizer.safetensors";

// A parameter's values as Hugging Face stores them: out-in matrices are nn.Linear's [out, in]
// already, the table is [V, H], a norm's [1, H] row is the vector [H].
runtime::HostTensor as_saved(const runtime::ShardedTensor& t) {
  runtime::HostTensor host = runtime::gather(t);
  if (host.shape.size() == 2 && host.shape[0] == 1) host.shape = {host.shape[1]};
  return host;
}

// The shape a parameter is saved in (as_saved's).
std::vector<std::int64_t> saved_shape(const runtime::ShardedTensor& t) {
  std::vector<std::int64_t> shape = t.shape();
  if (shape.size() == 2 && shape[0] == 1) shape = {shape[1]};
  return shape;
}

// The Hugging Face tensors a parameter is saved as.
std::vector<HfTensorPart> parts_of(const ops::TrainableParameter& p, Architecture architecture) {
  const std::vector<std::int64_t>& shape = p.value->shape();
  return hf_tensor_parts(p.name, architecture, shape.size() == 3 ? shape[0] : 0);
}

// The shape of the part `part` of a parameter saved as `shape` (as_saved's).
std::vector<std::int64_t> hf_shape(std::vector<std::int64_t> shape, const HfTensorPart& part) {
  if (part.expert >= 0) shape.erase(shape.begin());
  if (part.transposed) std::reverse(shape.begin(), shape.end());
  return shape;
}

// The part `part` of `host` (a parameter as as_saved gives it), as Hugging Face stores it.
runtime::HostTensor as_hf(const runtime::HostTensor& host, const HfTensorPart& part) {
  if (part.expert < 0) return part.transposed ? ops::transposed(host) : host;
  runtime::HostTensor one = runtime::HostTensor::zeros({host.shape[1], host.shape[2]});
  std::copy_n(host.data.begin() + part.expert * static_cast<std::int64_t>(one.data.size()),
              one.data.size(), one.data.begin());
  return part.transposed ? ops::transposed(one) : one;
}

// The rows of its Hugging Face tensor a part covers (all of them unless the part is a slice of
// a fused tensor, Phi-3's), `rows` being the part's own.
FusedRows rows_of(const HfTensorPart& part, const HfConfig& c, std::int64_t rows) {
  return fused_rows(part.fused, c.num_attention_heads * c.head_dim,
                    c.num_key_value_heads * c.head_dim, c.intermediate_size, rows);
}

// Tensors to write, each part to its own, or into its rows of a fused tensor that several
// parameters share (written once, whole, when the last of them has put its rows in).
class SavedTensors {
 public:
  explicit SavedTensors(const HfConfig& config) : config_(config) {}
  void put(const std::string& name, runtime::HostTensor piece, const HfTensorPart& part) {
    if (part.fused == FusedPart::kWhole) {
      tensors_.push_back({name, &storage_.emplace_back(std::move(piece)), DType::kF32});
      return;
    }
    const FusedRows r = rows_of(part, config_, piece.shape[0]);
    auto [it, fresh] = fused_.try_emplace(name, nullptr);
    if (fresh) {
      it->second = &storage_.emplace_back(runtime::HostTensor::zeros({r.total, piece.shape[1]}));
      tensors_.push_back({name, it->second, DType::kF32});
    }
    std::copy(piece.data.begin(), piece.data.end(),
              it->second->data.begin() + r.offset * piece.shape[1]);
  }
  const std::vector<TensorToWrite>& tensors() const noexcept { return tensors_; }

 private:
  const HfConfig& config_;
  std::list<runtime::HostTensor> storage_;  // stable addresses for TensorToWrite
  std::vector<TensorToWrite> tensors_;
  std::map<std::string, runtime::HostTensor*> fused_;
};

}  // namespace

void TrainingOptions::validate() const {
  NUMESH_CHECK(batch > 0 && tokens > 0, ValueError,
               "training: batch {} and tokens {} must be positive", batch, tokens);
  NUMESH_CHECK(clip >= 0.0 && std::isfinite(clip), ValueError,
               "training: clip {} must be 0 (none) or positive", clip);
  NUMESH_CHECK(!router_aux_loss_coef ||
                   (*router_aux_loss_coef >= 0.0 && std::isfinite(*router_aux_loss_coef)),
               ValueError,
               "training: the router's aux loss coefficient {} must be 0 (off) or positive",
               router_aux_loss_coef.value_or(0.0));
  ops::validate(adamw);
  schedule.validate();
}

CausalLmTrainer::CausalLmTrainer(runtime::DeviceMesh mesh, nlohmann::json config_doc,
                                 const CausalLmWeights& weights, TrainingOptions options,
                                 ops::ModelAxes axes)
    : config_doc_(std::move(config_doc)),
      config_(HfConfig::parse(config_doc_, "config.json")),
      options_(std::move(options)) {
  options_.validate();
  // transformers adds the load-balancing loss when the config asks for the router logits.
  const auto wants = config_doc_.find("output_router_logits");
  NUMESH_CHECK(wants == config_doc_.end() || wants->is_boolean(), ValueError,
               "config.json: output_router_logits is {}, not true or false", wants->dump());
  if (options_.router_aux_loss_coef) {
    router_aux_loss_coef_ = *options_.router_aux_loss_coef;
  } else if (wants != config_doc_.end() && wants->get<bool>()) {
    const auto coef = config_doc_.find("router_aux_loss_coef");
    NUMESH_CHECK(coef == config_doc_.end() || coef->is_number(), ValueError,
                 "config.json: router_aux_loss_coef is {}, not a number", coef->dump());
    router_aux_loss_coef_ =
        coef != config_doc_.end() ? coef->get<double>() : 0.001;  // transformers' default
    NUMESH_CHECK(router_aux_loss_coef_ >= 0.0 && std::isfinite(router_aux_loss_coef_), ValueError,
                 "config.json: router_aux_loss_coef {} must not be negative",
                 router_aux_loss_coef_);
  }
  step_ = std::make_unique<ops::LmTrainingStep>(
      std::move(mesh), config_.transformer_config(), weights.embedding, weights.stack,
      config_.tie_word_embeddings ? nullptr : &weights.lm_head, options_.batch, options_.tokens,
      std::move(axes), options_.precision, router_aux_loss_coef_);
  std::vector<runtime::ShardedTensor*> values;
  for (const ops::TrainableParameter& p : step_->parameters()) values.push_back(p.value.get());
  adamw_ = std::make_unique<ops::AdamW>(std::move(values), options_.adamw);
}

namespace {

// A GGUF model's metadata as the config.json a trainer keeps and saves.
// Throws: NotImplementedError when the config has no config.json form.
nlohmann::json trainable_document(const GgufCheckpoint& checkpoint) {
  NUMESH_CHECK(checkpoint.config_document().has_value(), NotImplementedError,
               "{}: its RoPE frequency factors (rope_freqs.weight) are not a llama3 scaling's, "
               "and a config.json has no form for others, while training saves a Hugging Face "
               "folder: train from the model's Hugging Face folder instead",
               checkpoint.location().string());
  return *checkpoint.config_document();
}

}  // namespace

CausalLmTrainer CausalLmTrainer::from_initial_weights(runtime::DeviceMesh mesh,
                                                      const std::filesystem::path& dir,
                                                      std::uint32_t seed, TrainingOptions options,
                                                      ops::ModelAxes axes) {
  if (GgufCheckpoint::is_gguf(dir)) {
    const GgufCheckpoint checkpoint = GgufCheckpoint::open(dir);
    return CausalLmTrainer(std::move(mesh), trainable_document(checkpoint),
                           initial_weights(checkpoint.config(), seed), std::move(options),
                           std::move(axes));
  }
  const HfConfig config = HfConfig::load(dir);  // checks the file, naming what is wrong
  std::ifstream in(dir / "config.json");
  return CausalLmTrainer(std::move(mesh), nlohmann::json::parse(in), initial_weights(config, seed),
                         std::move(options), std::move(axes));
}

CausalLmTrainer CausalLmTrainer::load(runtime::DeviceMesh mesh, const std::filesystem::path& dir,
                                      TrainingOptions options, ops::ModelAxes axes,
                                      const WeightsProgress& progress) {
  if (GgufCheckpoint::is_gguf(dir)) {
    // Its weights in fp32 (a block format's dequantized as GGML defines it); no optimizer state.
    const GgufCheckpoint checkpoint = GgufCheckpoint::open(dir);
    nlohmann::json doc = trainable_document(checkpoint);
    const CausalLmWeights weights =
        CausalLmWeights::load(checkpoint.config(), checkpoint, DType::kF32, progress);
    return CausalLmTrainer(std::move(mesh), std::move(doc), weights, std::move(options),
                           std::move(axes));
  }
  const HfConfig config = HfConfig::load(dir);  // checks the file, naming what is wrong
  std::ifstream in(dir / "config.json");
  nlohmann::json doc = nlohmann::json::parse(in);  // well-formed: HfConfig::load read it
  const SafetensorsCheckpoint checkpoint = SafetensorsCheckpoint::open(dir);
  const CausalLmWeights weights = CausalLmWeights::load(config, checkpoint, DType::kF32, progress);
  CausalLmTrainer trainer(std::move(mesh), std::move(doc), weights, std::move(options),
                          std::move(axes));
  if (std::filesystem::exists(dir / kOptimizerFile))
    trainer.restore_optimizer(dir / kOptimizerFile);
  return trainer;
}

CausalLmTrainer::~CausalLmTrainer() = default;
CausalLmTrainer::CausalLmTrainer(CausalLmTrainer&&) noexcept = default;
CausalLmTrainer& CausalLmTrainer::operator=(CausalLmTrainer&&) noexcept = default;

std::int64_t CausalLmTrainer::steps() const noexcept { return adamw_->steps(); }

std::vector<NamedTensor> CausalLmTrainer::weights() const {
  std::vector<NamedTensor> all;
  for (const ops::TrainableParameter& p : step_->parameters()) {
    all.push_back({weight_label(p.name, config_.architecture, config_.num_experts), p.value.get()});
  }
  return all;
}

std::int64_t CausalLmTrainer::parameter_count() const {
  std::int64_t n = 0;
  for (const ops::TrainableParameter& p : step_->parameters()) {
    std::int64_t elements = 1;
    for (const std::int64_t e : p.value->shape()) elements *= e;
    n += elements;
  }
  return n;
}

StepStats CausalLmTrainer::step(std::span<const std::int32_t> rows) {
  const std::int64_t b = options_.batch, t = options_.tokens;
  NUMESH_CHECK(static_cast<std::int64_t>(rows.size()) == b * (t + 1), ShapeError,
               "training: {} ids for a batch of {} rows of {} ids (tokens + 1; expected {})",
               rows.size(), b, t + 1, b * (t + 1));
  inputs_.resize(static_cast<std::size_t>(b * t));
  targets_.resize(static_cast<std::size_t>(b * t));
  for (std::int64_t r = 0; r < b; ++r) {
    const auto row =
        rows.subspan(static_cast<std::size_t>(r * (t + 1)), static_cast<std::size_t>(t + 1));
    std::copy(row.begin(), row.end() - 1, inputs_.begin() + r * t);
    std::copy(row.begin() + 1, row.end(), targets_.begin() + r * t);
  }
  StepStats stats;
  auto start = std::chrono::steady_clock::now();
  stats.loss = step_->run(inputs_, targets_);
  stats.forward_backward_seconds = seconds_since(start);
  stats.router_aux_loss = step_->router_aux_loss();
  start = std::chrono::steady_clock::now();
  std::vector<const runtime::ShardedTensor*> grads;
  for (const ops::TrainableParameter& p : step_->parameters()) grads.push_back(p.grad.get());
  // The norm is reported with or without clipping; the clip scales the gradients inside the
  // update (AdamW's grad_scale), as clip_grad_norm_ before torch's step would.
  stats.grad_norm = ops::grad_norm(grads);
  stats.grad_norm_seconds = seconds_since(start);
  NUMESH_CHECK(std::isfinite(stats.grad_norm), ValueError,
               "training: step {} has a gradient norm of {} (loss {}); the weights are left as "
               "they were before it",
               adamw_->steps() + 1, stats.grad_norm, stats.loss);
  stats.lr = options_.schedule.at(adamw_->steps());
  const double scale =
      options_.clip > 0.0 ? ops::clip_coefficient(stats.grad_norm, options_.clip) : 1.0;
  // The update is whole or not begun: a cancel (Ctrl-C in Python) stops a step before it,
  // when the weights and the optimizer's moments are still the last step's, and not after.
  const runtime::CancelSource* source = runtime::CancelScope::current();
  NUMESH_CHECK(source == nullptr || !source->cancelled(), CancelledError,
               "training: step {} cancelled before its update; the weights are as they were",
               adamw_->steps() + 1);
  start = std::chrono::steady_clock::now();
  {
    const runtime::CancelShield whole;
    adamw_->step(grads, stats.lr, scale);
  }
  stats.update_seconds = seconds_since(start);
  stats.step = adamw_->steps();
  return stats;
}

void CausalLmTrainer::save(const std::filesystem::path& dir) const {
  // Every rank gathers (a collective across ranks); rank 0 alone writes.
  const std::vector<ops::TrainableParameter>& params = step_->parameters();
  SavedTensors weights(config_), state(config_);
  for (std::size_t i = 0; i < params.size(); ++i) {
    const runtime::HostTensor value = as_saved(*params[i].value), m = as_saved(adamw_->exp_avg(i)),
                              v = as_saved(adamw_->exp_avg_sq(i));
    for (const HfTensorPart& part : parts_of(params[i], config_.architecture)) {
      weights.put(part.name, as_hf(value, part), part);
      state.put("exp_avg." + part.name, as_hf(m, part), part);
      state.put("exp_avg_sq." + part.name, as_hf(v, part), part);
    }
  }
  if (step_->mesh().this_rank() != 0) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  NUMESH_CHECK(!ec, IoError, "cannot create the checkpoint directory {}: {}", dir.string(),
               ec.message());
  {
    std::ofstream out(dir / "config.json");
    out << config_doc_.dump(2) << "\n";
    NUMESH_CHECK(out.good(), IoError, "cannot write {}", (dir / "config.json").string());
  }
  write_safetensors(dir / "model.safetensors", weights.tensors(), {{"format", "pt"}});
  write_safetensors(dir / kOptimizerFile, state.tensors(),
                    {{"optimizer", "adamw"}, {"step", std::to_string(adamw_->steps())}});
}

void CausalLmTrainer::restore_optimizer(const std::filesystem::path& file) {
  const SafetensorsFile f = SafetensorsFile::open(file);
  const auto& meta = f.metadata();
  const auto step = meta.find("step");
  NUMESH_CHECK(step != meta.end() && !step->second.empty() &&
                   step->second.find_first_not_of("0123456789") == std::string::npos &&
                   step->second.size() < 12,
               ValueError,
               "{}: the metadata has no step count (a file numesh train did not write?)",
               file.string());
  const std::vector<ops::TrainableParameter>& params = step_->parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::vector<std::int64_t> saved = saved_shape(*params[i].value);
    for (const auto& [prefix, tensor] : {std::pair{"exp_avg.", &adamw_->exp_avg(i)},
                                         std::pair{"exp_avg_sq.", &adamw_->exp_avg_sq(i)}}) {
      runtime::HostTensor host = runtime::HostTensor::zeros(tensor->shape());
      for (const HfTensorPart& part : parts_of(params[i], config_.architecture)) {
        const std::string key = prefix + part.name;
        const std::vector<std::int64_t> shape = hf_shape(saved, part);
        // A slice of a fused tensor: its rows of the whole.
        const FusedRows rows = rows_of(part, config_, shape.front());
        std::vector<std::int64_t> whole = shape;
        whole.front() = rows.total;
        const TensorInfo& info = f.info(key);
        NUMESH_CHECK(info.shape == whole, ShapeError, "{}: {} is [{}] but the model's {} is [{}]",
                     file.string(), key, fmt::join(info.shape, ", "), part.name,
                     fmt::join(whole, ", "));
        runtime::HostTensor read = runtime::HostTensor::zeros(shape);
        if (part.fused == FusedPart::kWhole) {
          f.read(key, DType::kF32, std::as_writable_bytes(std::span<float>(read.data)));
        } else {
          runtime::HostTensor all = runtime::HostTensor::zeros(whole);
          f.read(key, DType::kF32, std::as_writable_bytes(std::span<float>(all.data)));
          const std::int64_t row = shape.back();
          std::copy_n(all.data.begin() + rows.offset * row, rows.rows * row, read.data.begin());
        }
        if (part.transposed) read = ops::transposed(read);
        std::copy(read.data.begin(), read.data.end(),
                  host.data.begin() + std::max<std::int64_t>(part.expert, 0) *
                                          static_cast<std::int64_t>(read.data.size()));
      }
      runtime::scatter(host, *tensor);
    }
  }
  adamw_->set_steps(std::stoll(step->second));
}

std::vector<std::int32_t> training_batch(std::span<const std::int32_t> data,
                                         std::span<const std::int64_t> shape, std::int64_t step,
                                         std::int64_t batch, std::int64_t tokens) {
  NUMESH_CHECK(shape.size() == 2 && shape[1] == tokens + 1 &&
                   static_cast<std::int64_t>(data.size()) == shape[0] * shape[1],
               ShapeError, "training data is [{}]; it must be [S, {}] (rows of tokens + 1 ids)",
               fmt::join(shape, ", "), tokens + 1);
  NUMESH_CHECK(shape[0] >= batch, ShapeError,
               "training data holds {} sequences, fewer than one batch of {}", shape[0], batch);
  std::vector<std::int32_t> rows(static_cast<std::size_t>(batch * (tokens + 1)));
  for (std::int64_t r = 0; r < batch; ++r) {
    const std::int64_t row = (step * batch + r) % shape[0];
    std::copy_n(data.begin() + row * (tokens + 1), tokens + 1, rows.begin() + r * (tokens + 1));
  }
  return rows;
}

}  // namespace numesh::models
