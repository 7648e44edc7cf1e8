#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <vector>

#include "numesh/models/hf/hf_config.hpp"
#include "numesh/models/hf/hf_weights.hpp"
#include "numesh/models/hf/nonfinite_weights.hpp"
#include "numesh/ops/lowering/lm_training.hpp"
#include "numesh/ops/lowering/model_axes.hpp"
#include "numesh/ops/optimizer.hpp"
#include "numesh/runtime/device_mesh.hpp"

// Training a Hugging Face causal language model on a device mesh: one LmTrainingStep program
// for the forward and backward, then the global-norm clip and AdamW on the sharded gradients,
// and checkpoints in Hugging Face layout (config.json, model.safetensors in F32) with the
// optimizer's state beside them (optimizer.safetensors), from which training resumes exactly.

namespace numesh::models {

/// How a trainer steps. Every field has a default but `tokens`.
struct TrainingOptions {
  std::int64_t batch = 8;   ///< sequences per step
  std::int64_t tokens = 0;  ///< input tokens per sequence: each data row holds tokens + 1 ids
  ops::AdamWOptions adamw;  ///< betas, eps, weight decay (adamw.lr is unused: the schedule's lr is)
  double clip = 1.0;        ///< the gradients' global 2-norm is clipped to this; 0: no clipping
  ops::LearningRateSchedule schedule;  ///< the learning rate of each step
  /// The products' precision: kBF16 computes in bf16 on the fp32 master weights
  /// (ops::LmTrainingStep); gradients, AdamW's state and the saved weights stay fp32.
  ops::MatmulPrecision precision = ops::MatmulPrecision::kF32;
  /// The router's load-balancing loss coefficient (MoE models; 0: off). Unset: as transformers
  /// trains the config, router_aux_loss_coef (default 0.001) when output_router_logits is true,
  /// else off.
  std::optional<double> router_aux_loss_coef;

  /// Throws: ValueError naming the value for a non-positive batch or tokens, a negative clip,
  /// bad AdamW options (ops::validate) or a bad schedule.
  void validate() const;
};

/// What one step did.
struct StepStats {
  std::int64_t step = 0;   ///< 1-based: the number of updates made so far
  double loss = 0.0;       ///< the mean cross-entropy over the batch's batch x tokens targets
  double lr = 0.0;         ///< the learning rate of the update
  double grad_norm = 0.0;  ///< the gradients' global 2-norm before clipping
  /// Where the step's time went, in seconds: the program (forward, loss and every backward),
  /// the gradients' global norm, and the AdamW update (with the clip's scale).
  double forward_backward_seconds = 0.0;
  double grad_norm_seconds = 0.0;
  double update_seconds = 0.0;
  /// The router's load-balancing loss (before its coefficient; included in `loss`), 0 when off.
  double router_aux_loss = 0.0;
};

/// A causal LM being trained. Not thread-safe: one thread drives an instance.
class CausalLmTrainer {
 public:
  /// Lays out `weights` (read as fp32) for `config_doc` (a config.json document, saved with
  /// every checkpoint) and compiles the step. Optimizer state starts at zero, step 0.
  /// Throws: ValueError as HfConfig::parse and TrainingOptions::validate; what
  /// ops::LmTrainingStep's constructor throws (a batch the data-parallel axes do not split,
  /// weights not stored fp32).
  CausalLmTrainer(runtime::DeviceMesh mesh, nlohmann::json config_doc,
                  const CausalLmWeights& weights, TrainingOptions options,
                  ops::ModelAxes axes = {});
  /// The model in `dir` (config.json and its safetensors, read as F32), and, when dir holds an
  /// optimizer.safetensors that a save() wrote, the optimizer's moments and step count, so that
  /// training continues where it stopped. Or a GGUF model (GgufCheckpoint::is_gguf(dir)): its
  /// metadata as the config.json (GgufCheckpoint::config_document), its weights in F32 (block
  /// formats dequantized), the optimizer's state at zero; save() writes a Hugging Face folder.
  /// `progress` (when set) is told the checkpoint bytes read as the weights are read.
  /// Throws for a GGUF model also: NotImplementedError when its config has no config.json form
  /// (a rope_freqs tensor), naming the file; what GgufCheckpoint::open throws.
  /// Throws: as HfConfig::load, SafetensorsCheckpoint::open and CausalLmWeights::load (a
  /// checkpoint that does not fit the config: ShapeError naming the tensor); ShapeError or
  /// KeyError naming the tensor when the optimizer's state does not fit the model; as the
  /// constructor.
  static CausalLmTrainer load(runtime::DeviceMesh mesh, const std::filesystem::path& dir,
                              TrainingOptions options, ops::ModelAxes axes = {},
                              const WeightsProgress& progress = {});
  /// The model of dir/config.json (or of a GGUF model's metadata, as load() reads it) with
  /// transformers' initial weights (initial_weights(config, seed)), optimizer state at zero,
  /// step 0: training from scratch.
  /// Throws: as HfConfig::load and the constructor.
  static CausalLmTrainer from_initial_weights(runtime::DeviceMesh mesh,
                                              const std::filesystem::path& dir, std::uint32_t seed,
                                              TrainingOptions options, ops::ModelAxes axes = {});
  ~CausalLmTrainer();
  CausalLmTrainer(CausalLmTrainer&&) noexcept;
  CausalLmTrainer& operator=(CausalLmTrainer&&) noexcept;

  /// One update from `rows`: batch rows of tokens + 1 ids each, row-major; inputs are each
  /// row's first tokens ids, targets its last tokens. Runs the step, clips the gradients,
  /// updates the weights with AdamW at the schedule's rate for this step.
  /// Throws: ShapeError when rows does not hold batch x (tokens + 1) ids; IndexError naming the
  /// sequence, position and id outside the vocabulary (before anything runs); ValueError when
  /// the gradient norm is not finite (naming the step and the loss; the weights are left as
  /// they were before the step); CancelledError when a CancelScope's source (cancellation.hpp)
  /// was cancelled before the update began (the weights and the optimizer's state are as they
  /// were; once begun, the update completes).
  StepStats step(std::span<const std::int32_t> rows);

  /// Writes dir/config.json, dir/model.safetensors (every weight in F32 under its Hugging Face
  /// name: numesh generate and transformers load it) and dir/optimizer.safetensors (each
  /// weight's exp_avg and exp_avg_sq, named "exp_avg.<name>", "exp_avg_sq.<name>", the step
  /// count in the metadata). Creates dir when missing; replaces those files. On a mesh over
  /// ranks, a collective: every rank gathers the weights, rank 0 alone writes.
  /// Throws: IoError naming a file that cannot be written (on rank 0).
  void save(const std::filesystem::path& dir) const;

  /// Updates made so far (resumed ones included).
  std::int64_t steps() const noexcept;
  /// The options.
  const TrainingOptions& options() const noexcept { return options_; }
  /// The parsed config.
  const HfConfig& config() const noexcept { return config_; }
  /// The mesh it trains on.
  const runtime::DeviceMesh& mesh() const noexcept { return step_->mesh(); }
  /// Every parameter (fp32 master weights) by the name a user knows it (weight_label).
  std::vector<NamedTensor> weights() const;
  /// The router's load-balancing loss coefficient in use (0: off).
  double router_aux_loss_coef() const noexcept { return router_aux_loss_coef_; }
  /// The step program (its parameters, plan and FLOPs).
  ops::LmTrainingStep& program() noexcept { return *step_; }
  /// Parameters of the model (elements of every trained tensor).
  std::int64_t parameter_count() const;

 private:
  void restore_optimizer(const std::filesystem::path& file);

  nlohmann::json config_doc_;
  HfConfig config_;
  TrainingOptions options_;
  double router_aux_loss_coef_ = 0.0;
  std::unique_ptr<ops::LmTrainingStep> step_;
  std::unique_ptr<ops::AdamW> adamw_;
  std::vector<std::int32_t> inputs_, targets_;
};

/// The rows of training step k (0-based) of data [S, tokens + 1]: rows (k B .. k B + B - 1)
/// mod S, as one row-major block.
/// Throws: ShapeError when `shape` is not [S, tokens + 1] with S >= batch (the data must hold
/// one batch; naming both).
std::vector<std::int32_t> training_batch(std::span<const std::int32_t> data,
                                         std::span<const std::int64_t> shape, std::int64_t step,
                                         std::int64_t batch, std::int64_t tokens);

}  // namespace numesh::models
