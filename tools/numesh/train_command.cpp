#include "train_command.hpp"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "nonfinite_note.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/progress_line.hpp"
#include "numesh/core/timing.hpp"
#include "numesh/models/engine/model_source.hpp"
#include "numesh/models/formats/npy.hpp"
#include "numesh/models/hf/gguf_checkpoint.hpp"
#include "numesh/models/hf/hf_config.hpp"
#include "numesh/models/hf/random_model.hpp"
#include "numesh/models/lm/trainer.hpp"
#include "numesh/models/tokenizers/text_tokenizer.hpp"
#include "numesh/runtime/cpu_features.hpp"
#include "numesh/sharding/partition_manager.hpp"
#include "parsers.hpp"
#include "paxis_options.hpp"

namespace numesh::tools {

namespace {

using Clock = std::chrono::steady_clock;

// The training data as rows of tokens + 1 ids.
struct Data {
  std::vector<std::int32_t> ids;
  std::vector<std::int64_t> shape;  // [S, tokens + 1]
};

// --data: an .npy of ids [S, T + 1], or text encoded by the model's tokenizer and cut into
// consecutive rows of tokens + 1 ids (the tail that fills no row is left out).
Data read_data(const TrainOptions& o, const models::ModelSource& model) {
  NUMESH_CHECK(std::filesystem::exists(o.data), IoError, "--data '{}' does not exist", o.data);
  Data d;
  if (std::filesystem::path(o.data).extension() == ".npy") {
    models::NpyIds npy = models::load_npy_ids(o.data);
    NUMESH_CHECK(
        npy.shape.size() == 2 && npy.shape[1] >= 2, ShapeError,
        "--data '{}' is [{}]; training data is [S, T + 1] (rows of T inputs and their next token)",
        o.data, fmt::join(npy.shape, ", "));
    NUMESH_CHECK(o.tokens == 0 || o.tokens == npy.shape[1] - 1, ValueError,
                 "--tokens {} does not match --data '{}', whose rows hold {} ids (T = {})",
                 o.tokens, o.data, npy.shape[1], npy.shape[1] - 1);
    d.ids = std::move(npy.values);
    d.shape = npy.shape;
    return d;
  }
  NUMESH_CHECK(o.tokens >= 1, ValueError,
               "--data '{}' is text: give the sequence length with --tokens T", o.data);
  NUMESH_CHECK(model.tokenizer() != nullptr, IoError,
               "--data '{}' is text, but {} has no tokenizer (tokenizer.json or tokenizer.model, "
               "or a GGUF file's tokenizer.ggml.*) to encode it",
               o.data, model.path().string());
  std::ifstream in(o.data, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<std::int32_t> all = model.tokenizer()->encode(text, false);
  const std::int64_t row = o.tokens + 1, rows = static_cast<std::int64_t>(all.size()) / row;
  d.ids.assign(all.begin(), all.begin() + rows * row);
  d.shape = {rows, row};
  return d;
}

// Refuses ids the model cannot embed, naming the first one: before any step runs.
void check_ids(const Data& d, std::int64_t vocab, const std::string& file) {
  for (std::size_t i = 0; i < d.ids.size(); ++i) {
    const std::int32_t id = d.ids[i];
    NUMESH_CHECK(
        id >= 0 && id < vocab, IndexError,
        "--data '{}': id {} at row {}, column {} is outside the model's vocabulary [0, {})", file,
        id, static_cast<std::int64_t>(i) / d.shape[1], static_cast<std::int64_t>(i) % d.shape[1],
        vocab);
  }
}

// Copies the files beside the weights that make the saved folder a whole model (its tokenizer
// and generation settings) from the model's folder, unless it is the same folder.
void copy_model_files(const std::filesystem::path& from, const std::filesystem::path& to) {
  std::error_code ec;
  if (std::filesystem::equivalent(from, to, ec)) return;
  for (const char* name : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                           "special_tokens_map.json", "generation_config.json"}) {
    if (!std::filesystem::exists(from / name)) continue;
    std::filesystem::copy_file(from / name, to / name,
                               std::filesystem::copy_options::overwrite_existing, ec);
    NUMESH_CHECK(!ec, IoError, "cannot copy {} into {}: {}", (from / name).string(), to.string(),
                 ec.message());
  }
}

// The options that need nothing read to be checked.
void check_options(const TrainOptions& o) {
  NUMESH_CHECK(o.init == "checkpoint" || o.init == "random", ValueError,
               "--init '{}' is not checkpoint or random", o.init);
  NUMESH_CHECK(o.schedule == "constant" || o.schedule == "cosine", ValueError,
               "--schedule '{}' is not constant or cosine", o.schedule);
  NUMESH_CHECK(o.steps >= 1, ValueError, "--steps {} must be at least 1", o.steps);
  NUMESH_CHECK(o.dtype == "f32" || o.dtype == "bf16", ValueError,
               "--dtype '{}' is not a compute dtype training takes: f32 or bf16 (weights stay f32)",
               o.dtype);
  NUMESH_CHECK(o.save_every >= 0, ValueError, "--save-every {} is negative", o.save_every);
  NUMESH_CHECK(o.save_every == 0 || !o.save.empty(), ValueError, "--save-every {} needs --save DIR",
               o.save_every);
  check_mesh_options(o.mesh);
}

// The trainer's options from the command's (validated), for sequences of `tokens` tokens.
models::TrainingOptions training_options(const TrainOptions& o, std::int64_t tokens) {
  models::TrainingOptions options;
  options.batch = o.batch;
  options.tokens = tokens;
  options.adamw = ops::AdamWOptions{
      .lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay};
  options.clip = o.clip;
  options.precision = o.dtype == "bf16" ? ops::MatmulPrecision::kBF16 : ops::MatmulPrecision::kF32;
  if (!std::isnan(o.router_aux_loss_coef)) options.router_aux_loss_coef = o.router_aux_loss_coef;
  options.schedule = ops::LearningRateSchedule{
      .lr = o.lr,
      .warmup = o.warmup,
      .total = o.steps,
      .kind = o.schedule == "cosine" ? ops::LearningRateSchedule::Kind::kCosine
                                     : ops::LearningRateSchedule::Kind::kConstant};
  options.validate();
  return options;
}

// The trainer: the folder's config with transformers' initial weights (--init random), or the
// folder's checkpoint (and optimizer state, when saved by numesh train) to resume from.
std::optional<models::CausalLmTrainer> make_trainer(const TrainOptions& o,
                                                    const std::filesystem::path& dir,
                                                    const runtime::DeviceMesh& mesh,
                                                    const models::TrainingOptions& options,
                                                    const ops::ModelAxes& axes) {
  std::optional<models::CausalLmTrainer> trainer;
  if (o.init == "random") {
    trainer.emplace(
        models::CausalLmTrainer::from_initial_weights(mesh, dir, o.seed, options, axes));
  } else {
    NUMESH_CHECK(models::GgufCheckpoint::is_gguf(dir) ||
                     std::filesystem::exists(dir / "model.safetensors") ||
                     std::filesystem::exists(dir / "model.safetensors.index.json"),
                 IoError,
                 "--model {} holds no safetensors weights to start from; give --init random to "
                 "initialise them",
                 dir.string());
    const ProgressLine line(o.quiet);
    trainer.emplace(models::CausalLmTrainer::load(mesh, dir, options, axes,
                                                  [&](std::int64_t done, std::int64_t total) {
                                                    line.update(load_progress_text(done, total));
                                                  }));
  }
  return trainer;
}

// Prints the model, the axes, the data, the compute dtype and the router's loss.
void report_setup(const TrainOptions& o, const std::filesystem::path& dir,
                  const models::HfConfig& config, const runtime::DeviceMesh& mesh,
                  const ops::ModelAxes& axes, const Data& data, std::int64_t first,
                  const models::CausalLmTrainer& trainer, std::ostream& out) {
  const std::int64_t tokens = data.shape[1] - 1;
  const double params = static_cast<double>(trainer.parameter_count());
  out << fmt::format(
      "numesh train: {} ({} model, {} layers, hidden {}, vocabulary {}), {:.2f} M parameters, mesh "
      "{}\n",
      dir.string(), to_string(config.architecture), config.num_hidden_layers, config.hidden_size,
      config.vocab_size, params / 1e6, mesh.mesh().repr());
  out << fmt::format("axes ({}): {}\n", o.mode, model_axes_text(axes));
  out << fmt::format(
      "data {}: {} sequences of {} tokens; batch {} ({} tokens a step); steps {} .. {}\n", o.data,
      data.shape[0], tokens, o.batch, o.batch * tokens, first + 1, o.steps);
  const bool fast_bf16 = runtime::kernel_level() >= runtime::KernelLevel::kAvx512Bf16;
  out << fmt::format("compute  {} (master weights, gradients and AdamW state f32){}\n", o.dtype,
                     o.dtype == "bf16" && !fast_bf16
                         ? "; this CPU (or NUMESH_KERNELS) has no AVX-512 BF16, so bf16 products "
                           "run through the f32 "
                           "GEMM on rounded operands: no faster than f32"
                         : "");
  if (config.num_experts > 0) {
    out << fmt::format(
        "router   load-balancing loss {}\n",
        trainer.router_aux_loss_coef() > 0.0
            ? fmt::format(
                  "x {} added to the loss ({})", trainer.router_aux_loss_coef(),
                  std::isnan(o.router_aux_loss_coef) ? "config.json" : "--router-aux-loss-coef")
            : std::string("off"));
  }
  out.flush();
}

// What the steps took, summed, and the first and last steps' figures.
struct Totals {
  models::StepStats last;
  std::optional<double> first_loss;
  double seconds = 0.0, program_seconds = 0.0, norm_seconds = 0.0, update_seconds = 0.0;
};

// Steps [first, --steps): each logged (--log) and shown; saved every --save-every steps; the
// last one traced node by node with --trace (per-node timing costs two clock reads a node).
Totals train_steps(const TrainOptions& o, const std::filesystem::path& dir, const Data& data,
                   std::int64_t first, models::CausalLmTrainer& trainer, std::ofstream& log) {
  const std::int64_t tokens = data.shape[1] - 1;
  const ProgressLine line(o.quiet);
  const double tokens_per_step = static_cast<double>(o.batch * tokens);
  Totals t;
  runtime::CompiledGraph& graph = trainer.program().program().graph();
  for (std::int64_t k = first; k < o.steps; ++k) {
    const std::vector<std::int32_t> rows =
        models::training_batch(data.ids, data.shape, k, o.batch, tokens);
    graph.set_timing(!o.trace.empty() && k + 1 == o.steps);
    const auto start = Clock::now();
    t.last = trainer.step(rows);
    const double seconds = seconds_since(start);
    t.seconds += seconds;
    t.program_seconds += t.last.forward_backward_seconds;
    t.norm_seconds += t.last.grad_norm_seconds;
    t.update_seconds += t.last.update_seconds;
    if (!t.first_loss) t.first_loss = t.last.loss;
    if (log.is_open()) {
      log << fmt::format("{},{:.9g},{:.9g},{:.9g},{:.6g},{:.6g}\n", t.last.step, t.last.loss,
                         t.last.lr, t.last.grad_norm, tokens_per_step / seconds, seconds);
      log.flush();
    }
    line.show(fmt::format("step {}/{}  loss {:.4f}  lr {:.3g}  grad norm {:.3g}  {:.0f} tokens/s",
                          t.last.step, o.steps, t.last.loss, t.last.lr, t.last.grad_norm,
                          tokens_per_step / seconds));
    if (o.save_every > 0 && t.last.step % o.save_every == 0 && t.last.step < o.steps) {
      trainer.save(o.save);
      if (trainer.mesh().this_rank() == 0) copy_model_files(dir, o.save);
    }
  }
  return t;
}

// Prints the loss from the first step to the last, the speed, where a step's time went and
// the files written.
void report_totals(const TrainOptions& o, const models::HfConfig& config, const Data& data,
                   std::int64_t first, const models::CausalLmTrainer& trainer, const Totals& t,
                   std::ostream& out) {
  const double tokens_per_step = static_cast<double>(o.batch * (data.shape[1] - 1));
  const double params = static_cast<double>(trainer.parameter_count());
  const double steps_run = static_cast<double>(o.steps - first);
  const double tokens_per_second = steps_run * tokens_per_step / t.seconds;
  out << fmt::format("loss     {:.4f} at step {} -> {:.4f} at step {}{}\n", *t.first_loss,
                     first + 1, t.last.loss, t.last.step,
                     config.num_experts > 0 && trainer.router_aux_loss_coef() > 0.0
                         ? fmt::format(" (router load-balancing loss {:.4f} at the last step)",
                                       t.last.router_aux_loss)
                         : "");
  out << fmt::format(
      "speed    {:.1f} ms a step, {:.0f} tokens/s, {:.1f} GFLOP/s (6 x parameters x tokens)\n",
      1e3 * t.seconds / steps_run, tokens_per_second, 6.0 * params * tokens_per_second / 1e9);
  out << fmt::format(
      "time     {:.1f} ms forward and backward, {:.1f} ms gradient norm, {:.1f} ms AdamW with "
      "clipping "
      "(a step, the mean)\n",
      1e3 * t.program_seconds / steps_run, 1e3 * t.norm_seconds / steps_run,
      1e3 * t.update_seconds / steps_run);
  if (!o.trace.empty()) out << fmt::format("trace    {} (step {})\n", o.trace, t.last.step);
  if (!o.save.empty())
    out << fmt::format("saved    {} (config.json, model.safetensors, optimizer.safetensors)\n",
                       o.save);
  if (!o.log.empty()) out << fmt::format("log      {}\n", o.log);
}

}  // namespace

CLI::App* add_train_command(CLI::App& app, TrainOptions& o) {
  CLI::App* cmd =
      app.add_subcommand("train",
                         "Train a Hugging Face causal LM (the Llama family, Qwen2/3, Mixtral, "
                         "Qwen2-MoE) on the machine's mesh: AdamW with clipping and a "
                         "warm-up/cosine schedule, a CSV log, Hugging Face checkpoints with the "
                         "optimizer's state, resumable.");
  cmd->footer(
      R"(Data: an int32 (or int64) .npy of shape [S, T+1]: step k trains on rows (k*B .. k*B+B-1) mod S,
inputs [:, :T], targets [:, 1:], the loss the mean cross-entropy over all B*T targets. Or a text
file, encoded by the model folder's tokenizer and cut into rows of --tokens + 1 ids.
The model: --model DIR holds config.json and, to start from them, safetensors weights; with
--init random the weights are initialised as transformers does (normal(0, 0.02), norms 1).
Or --model FILE.gguf: its metadata is the config, its weights (block formats dequantized) the
start; --save writes a Hugging Face folder (config.json, f32 safetensors) without a tokenizer
file, since the GGUF file's tokenizer lives in its metadata.
A DIR written by --save also holds optimizer.safetensors: training from it continues the same
trajectory (weights, AdamW moments, step count; --steps is the step count to reach).
MoE models: experts split over ep; the tokens are gathered to them, or, with ep among the batch
axes (--set batch_axis=(fsdp,dp,ep), quoted for the shell), sent to them and back by all-to-all.
Examples:
  numesh train --model DIR --init random --data train.npy --batch 8 --steps 200 --lr 3e-4 --warmup 20 --schedule cosine --log log.csv --save out
  numesh train --model out --data train.npy --batch 8 --steps 400 --lr 3e-4 --warmup 20 --schedule cosine --log log.csv --save out
  numesh train --model DIR --data corpus.txt --tokens 128 --batch 4 --steps 50 --dims 2,1,1 --names dp,ep,tp
  python3 scripts/plot_loss.py log.csv   # the loss curve, log_loss.png)");
  add_mesh_options(*cmd, o.mesh, /*with_threads=*/true);
  cmd->add_option("--mode", o.mode, "The mode eformer's semantic axes resolve in for the layout")
      ->capture_default_str();
  cmd->add_option("--paxis-json", o.paxis_json,
                  "JSON file with PartitionAxis fields (eformer's defaults otherwise)");
  cmd->add_option("--set", o.sets, "field=value for one PartitionAxis field, repeatable");
  cmd->add_option("--model", o.model, "Folder with config.json (and safetensors, optimizer state)")
      ->required();
  cmd->add_option("--init", o.init,
                  "checkpoint: start from the folder's weights; random: initialise them")
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "The random initial weights' seed")->capture_default_str();
  cmd->add_option("--data", o.data, "Token ids .npy [S, T+1], or a text file (with --tokens)")
      ->required();
  cmd->add_option("--tokens", o.tokens, "Sequence length T for text data (an .npy gives it)");
  cmd->add_option("--batch", o.batch, "Sequences per step")->capture_default_str();
  cmd->add_option("--steps", o.steps, "Train until this many steps are done")
      ->capture_default_str();
  cmd->add_option("--lr", o.lr, "Peak learning rate")->capture_default_str();
  cmd->add_option("--weight-decay", o.weight_decay, "AdamW's decoupled weight decay")
      ->capture_default_str();
  cmd->add_option("--beta1", o.beta1, "AdamW's beta1")->capture_default_str();
  cmd->add_option("--beta2", o.beta2, "AdamW's beta2")->capture_default_str();
  cmd->add_option("--eps", o.eps, "AdamW's eps")->capture_default_str();
  cmd->add_option("--clip", o.clip, "Clip the gradients' global 2-norm to this (0: no clipping)")
      ->capture_default_str();
  cmd->add_option("--warmup", o.warmup, "Steps of linear warm-up from 0 to --lr")
      ->capture_default_str();
  cmd->add_option("--schedule", o.schedule,
                  "After warm-up: constant, or cosine decay to 0 at --steps")
      ->capture_default_str();
  cmd->add_option("--log", o.log,
                  "Write step,loss,lr,grad_norm,tokens_per_second,seconds per step to a CSV file");
  cmd->add_option(
      "--save", o.save,
      "Save a Hugging Face checkpoint with the optimizer's state to DIR at the end (with the model "
      "folder's tokenizer and generation_config.json)");
  cmd->add_option("--save-every", o.save_every, "Also save every K steps (0: only at the end)")
      ->capture_default_str();
  cmd->add_option("--router-aux-loss-coef", o.router_aux_loss_coef,
                  "MoE models: add this times the router's load-balancing loss (transformers' "
                  "load_balancing_loss_func over every MoE layer) to the loss; 0: off. Default: as "
                  "config.json says "
                  "(router_aux_loss_coef when output_router_logits is true, else off)");
  cmd->add_option("--dtype", o.dtype,
                  "Compute dtype: f32, or bf16 (every product of activations and weights, forward "
                  "and backward, "
                  "rounds both to bf16 and sums in f32: twice the f32 rate on CPUs with AVX-512 "
                  "BF16, no faster "
                  "elsewhere). Master weights, gradients, AdamW's state and checkpoints stay f32")
      ->capture_default_str();
  cmd->add_option("--trace", o.trace,
                  "Write the last step's forward and backward, node by node, as Chrome trace JSON "
                  "(chrome://tracing, "
                  "Perfetto) to FILE");
  cmd->add_flag(
      "--refuse-nonfinite", o.refuse_nonfinite,
      "Refuse a checkpoint whose weights hold NaN or infinities (without it, a note names them)");
  cmd->add_flag("--quiet", o.quiet, "No progress on stderr");
  return cmd;
}

int run_train(const TrainOptions& o, std::ostream& out) {
  // Options first, then the data and the config, all before any weight is laid out.
  check_options(o);
  const sharding::ModeArg mode = parse_run_mode(o.mode);
  const sharding::PartitionManager partition_manager(build_paxis(o.paxis_json, o.sets));
  const std::filesystem::path dir = o.model;
  const models::ModelSource source = models::ModelSource::open(dir);
  const models::HfConfig& config = source.config();
  (void)config.transformer_config();  // refuses what numesh cannot run
  const Data data = read_data(o, source);
  const std::int64_t tokens = data.shape[1] - 1;
  NUMESH_CHECK(data.shape[0] >= o.batch, ShapeError,
               "--data '{}' holds {} sequences of {} ids, fewer than one batch of --batch {}",
               o.data, data.shape[0], data.shape[1], o.batch);
  check_ids(data, config.vocab_size, o.data);
  NUMESH_CHECK(tokens <= config.max_context(), ValueError,
               "sequences of {} tokens are longer than the model's context of {}", tokens,
               config.max_context());
  const models::TrainingOptions options = training_options(o, tokens);
  std::ofstream log;  // opened before training, so that an unwritable path is refused first
  const runtime::DeviceMesh mesh = make_mesh(o.mesh);
  const ops::ModelAxes axes =
      ops::ModelAxes::resolve(partition_manager, mode, o.batch, config.hidden_size);
  std::optional<models::CausalLmTrainer> trainer = make_trainer(o, dir, mesh, options, axes);
  // Before the log or trace file is opened: a refused checkpoint leaves them as they were.
  if (o.init == "checkpoint") {
    note_nonfinite_weights(models::find_nonfinite_weights(trainer->weights()), o.refuse_nonfinite,
                           dir.string(), out);
  }
  const std::int64_t first = trainer->steps();
  NUMESH_CHECK(first < o.steps, ValueError,
               "--model {} is already at step {}; --steps {} asks for no more", dir.string(), first,
               o.steps);
  // Under mpirun the ranks train alike and rank 0 alone writes the log, the trace and the
  // checkpoint's files.
  const bool writer = mesh.this_rank() == 0;
  if (!o.log.empty() && writer) {
    const bool append = first > 0 && std::filesystem::exists(o.log);
    log.open(o.log, append ? std::ios::app : std::ios::trunc);
    NUMESH_CHECK(log.is_open(), IoError, "cannot write --log file '{}'", o.log);
    if (!append) log << "step,loss,lr,grad_norm,tokens_per_second,seconds\n";
  }
  std::ofstream trace;  // opened before training too
  if (!o.trace.empty() && writer) {
    trace.open(o.trace);
    NUMESH_CHECK(trace.is_open(), IoError, "cannot write --trace file '{}'", o.trace);
  }
  report_setup(o, dir, config, mesh, axes, data, first, *trainer, out);

  const Totals totals = train_steps(o, dir, data, first, *trainer, log);
  if (trace.is_open()) {
    runtime::CompiledGraph& graph = trainer->program().program().graph();
    graph.set_timing(false);
    trace << graph.chrome_trace() << "\n";
    NUMESH_CHECK(trace.good(), IoError, "cannot write --trace file '{}'", o.trace);
  }
  if (!o.save.empty()) {
    trainer->save(o.save);
    if (writer) copy_model_files(dir, o.save);
  }
  report_totals(o, config, data, first, *trainer, totals, out);
  return 0;
}

}  // namespace numesh::tools
