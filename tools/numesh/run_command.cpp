#include "run_command.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <random>

#include "hidden_steps.hpp"
#include "kv_layout_option.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/timing.hpp"
#include "numesh/core/units.hpp"
#include "numesh/ops/compare.hpp"
#include "numesh/ops/lowering/transformer.hpp"
#include "numesh/ops/reference/transformer.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/slot_values.hpp"
#include "numesh/sharding/partition_manager.hpp"
#include "parsers.hpp"
#include "paxis_options.hpp"
#include "reference_check.hpp"
#include "render.hpp"

namespace numesh::tools {

namespace {

using Clock = std::chrono::steady_clock;

// Outputs agree with the dense reference within this relative bound: sharded reductions
// re-associate fp32 sums (see docs/ops.md for each operator's bound); measured errors are
// around 1e-6 for the default model.
constexpr double kCheckBound = 1e-4;
// With bf16 weights the activations entering each projection are rounded to bf16, in fp32 by the
// model and in float64 by the reference: the few values that lie within fp32 error of a bf16
// rounding boundary round to different sides, each moving its term by 2^-8 (docs/ops.md,
// "Weight dtypes"); measured 2.5e-3 on the default dense model.
constexpr double kBf16CheckBound = 1e-2;

std::string plan_summary(const ops::ProgramPlan& plan) {
  const double flops =
      plan.flops.empty() ? 0.0 : *std::max_element(plan.flops.begin(), plan.flops.end());
  const std::int64_t memory =
      plan.memory_bytes.empty()
          ? 0
          : *std::max_element(plan.memory_bytes.begin(), plan.memory_bytes.end());
  return fmt::format(
      "{}: {} nodes, {} collectives moving {} per device, {:.3f} GFLOP and {} per device",
      plan.name, plan.nodes, plan.collectives.size(),
      human_bytes(static_cast<std::uint64_t>(plan.collective_bytes())), flops / 1e9,
      human_bytes(static_cast<std::uint64_t>(memory)));
}

class Progress {
 public:
  explicit Progress(bool quiet) : on_(!quiet && isatty(STDERR_FILENO) != 0) {}
  void show(const std::string& text) const {
    if (!on_) return;
    std::fprintf(stderr, "\r\033[K%s", text.c_str());
    std::fflush(stderr);
  }
  void clear() const {
    if (on_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  bool on_;
};

// The model `numesh run` builds, from its options (validated).
ops::TransformerConfig model_config(const RunOptions& o) {
  ops::TransformerConfig config;
  config.hidden = o.hidden;
  config.layers = o.layers;
  config.attention = ops::AttentionConfig{
      .num_heads = o.heads, .num_kv_heads = o.kv_heads, .head_dim = o.head_dim};
  config.ffn = o.ffn;
  config.moe = ops::MoeConfig{.num_experts = o.experts,
                              .top_k = o.top_k,
                              .capacity_factor = static_cast<float>(o.capacity)};
  config.moe_ffn = o.moe_ffn;
  config.moe_every = o.moe_every;
  config.validate();
  NUMESH_CHECK(o.heads * o.head_dim > 0 && o.hidden > 0, ValueError, "--hidden {} must be positive",
               o.hidden);
  return config;
}

// Prints the devices and mesh, the model and the axes (and the devices' notes).
void report_setup(const RunOptions& o, const runtime::DeviceMesh& mesh,
                  const ops::TransformerConfig& config, DType dtype, const ops::ModelAxes& axes,
                  std::ostream& out) {
  const runtime::PlacementOptions& placement = mesh.devices().options();
  // Every rank's devices' threads (under mpirun each rank knows its own).
  std::vector<std::int64_t> per_slot(static_cast<std::size_t>(mesh.size()), 0);
  for (const std::int64_t s : mesh.local_slots())
    per_slot[static_cast<std::size_t>(s)] = mesh.device(s).spec().threads;
  std::int64_t threads = 0;
  for (const std::int64_t n : runtime::values_of_every_slot(mesh, per_slot)) threads += n;
  const std::string ranks =
      mesh.ranks() > 1 ? fmt::format(" on {} ranks (mpirun)", mesh.ranks()) : std::string();
  out << fmt::format("numesh run: {} device{}{} ({} policy, {} thread{}), mesh [{}], mode {}\n",
                     mesh.size(), mesh.size() == 1 ? "" : "s", ranks,
                     runtime::to_string(placement.policy), threads, threads == 1 ? "" : "s",
                     axes_text(mesh.mesh()), o.mode);
  out << fmt::format(
      "model: {} blocks ({} MoE), hidden {}, heads {}/{} x {}, ffn {}, experts {} top-{} x {}{}, "
      "{:.2f} M parameters, {} weights, kv cache {}\n",
      config.layers, config.moe_every > 0 ? config.layers / config.moe_every : 0, config.hidden,
      config.attention.num_heads, config.attention.num_kv_heads, config.attention.head_dim,
      config.ffn, config.moe.num_experts, config.moe.top_k, config.moe_ffn,
      o.capacity > 0 ? fmt::format(" capacity {}", o.capacity) : std::string(" dropless"),
      static_cast<double>(config.parameters()) / 1e6, to_string(dtype), o.kv_layout);
  out << fmt::format("axes ({}): {}\n", o.mode, model_axes_text(axes));
  for (const std::string& note : mesh.devices().notes()) out << "note: " << note << "\n";
  out.flush();
}

// What the timed runs produced and took.
struct Runs {
  runtime::HostTensor prompt, y;  // the prompt and the prefill's output
  ops::MoeStats prefill_stats;
  std::vector<double> prefill_times;
  std::vector<runtime::HostTensor> decode_inputs, decode_outputs;
  std::vector<double> decode_times;
  double decode_seconds = 0.0, decode_flops = 0.0, decode_bytes = 0.0;
};

// The prefill (the prompt at position 0, --repeats times: it rewrites the same cache positions),
// then `steps` decode steps, each feeding the last output back in.
Runs run_model(const RunOptions& o, const runtime::DeviceMesh& mesh,
               const ops::TransformerConfig& config, ops::ShardedTransformer& model,
               std::int64_t steps, const Progress& progress) {
  Runs r;
  r.prompt = random_tokens(o.batch, o.prompt, o.hidden, o.seed + 1);
  for (int i = 0; i < o.repeats; ++i) {
    progress.show(fmt::format("prefill {}/{} ...", i + 1, o.repeats));
    const auto t0 = Clock::now();
    r.y = model.forward(r.prompt, 0);
    r.prefill_times.push_back(seconds_since(t0));
  }
  r.prefill_stats = model.moe_stats();
  runtime::HostTensor next = last_token(r.y);
  const auto t_decode = Clock::now();
  for (std::int64_t i = 0; i < steps; ++i) {
    const std::int64_t position = o.prompt + i;
    const auto t0 = Clock::now();
    runtime::HostTensor step_y = model.forward(next, position);
    r.decode_times.push_back(seconds_since(t0));
    r.decode_flops += config.flops(o.batch, 1, position);
    r.decode_bytes += static_cast<double>(model.decode_bytes_per_device(position)) *
                      static_cast<double>(mesh.size());
    r.decode_inputs.push_back(std::move(next));
    next = last_token(step_y);
    r.decode_outputs.push_back(std::move(step_y));
    const double elapsed = seconds_since(t_decode);
    progress.show(fmt::format("decode {}/{}  {:.0f} tokens/s", i + 1, steps,
                              static_cast<double>(o.batch * (i + 1)) / elapsed));
  }
  r.decode_seconds = seconds_since(t_decode);
  return r;
}

// The check against the dense model on the same inputs.
struct Check {
  double bound = kCheckBound;
  bool moe_rounded = false;  // a MoE model whose activations are rounded: not compared (check_runs)
  bool checked = false;
  ReferenceCheck check{kCheckBound};
  double vs_fp32 = 0.0;  // 16-bit weights: the largest relative distance from the fp32 model
  bool ok() const { return !checked || check.ok(); }
};

// Every output against the dense model, teacher-forced (so each step is compared on its own
// rather than as a drifting trajectory). A routing decision is discontinuous: an activation
// rounded to the other neighbour (bf16) or quantized to the other code (q8_0, q4_0) by the
// kernel (fp32) than by the reference (float64) moves a router's logits enough to swap
// near-tied experts, and a swapped expert changes a token's output entirely. MoE models with
// those formats are therefore not compared element-wise (the tests check them on small models,
// where no decision is that close).
Check check_runs(const RunOptions& o, const runtime::DeviceMesh& mesh,
                 const ops::TransformerConfig& config, const ops::TransformerWeights& weights,
                 DType dtype, const ops::ModelAxes& axes, std::int64_t steps, std::int64_t max_len,
                 const Runs& r, const Progress& progress) {
  Check c;
  c.bound = kBlockFormatCheckBound;
  if (is_element_dtype(dtype)) {
    switch (element_type(dtype)) {
      case ElementType::kF32:
      case ElementType::kF16:
        c.bound = kCheckBound;
        break;
      case ElementType::kBF16:
        c.bound = kBf16CheckBound;
        break;
    }
  }
  c.check = ReferenceCheck(c.bound);
  c.moe_rounded = (dtype == DType::kBF16 || !is_element_dtype(dtype)) && config.moe_every > 0 &&
                  config.moe_every <= config.layers;
  // Under mpirun every rank holds the same outputs: rank 0 alone checks (and reports) them, and
  // its exit status says how the check went.
  c.checked = !o.no_check && !c.moe_rounded && mesh.this_rank() == 0;
  if (!c.checked) return c;
  progress.show("checking against the dense model ...");
  // The reference's MoE routing groups follow from the mesh and the axes: sequences split
  // over the batch axes, tokens over the sequence axis.
  ops::TransformerReference reference(config, weights, o.batch, max_len,
                                      ops::split_count(mesh.mesh(), axes.batch, o.batch),
                                      ops::sequence_groups(mesh.mesh(), axes.sequence));
  c.check.add("prefill", r.y, reference.forward(r.prompt, 0));
  for (std::int64_t i = 0; i < steps; ++i) {
    const auto idx = static_cast<std::size_t>(i);
    c.check.add("decode", r.decode_outputs[idx],
                reference.forward(r.decode_inputs[idx], o.prompt + i));
  }
  if (dtype != DType::kF32) {
    // What storing the weights in 16 bits costs: the same inputs through the fp32 dense model.
    progress.show("measuring the distance from the fp32 model ...");
    ops::TransformerWeights fp32_weights = weights;
    fp32_weights.store_as(DType::kF32);
    ops::TransformerReference fp32_model(config, fp32_weights, o.batch, max_len,
                                         ops::split_count(mesh.mesh(), axes.batch, o.batch),
                                         ops::sequence_groups(mesh.mesh(), axes.sequence));
    c.vs_fp32 =
        std::max(c.vs_fp32, ops::compare(r.y, fp32_model.forward(r.prompt, 0)).relative_error);
    for (std::int64_t i = 0; i < steps; ++i) {
      const auto idx = static_cast<std::size_t>(i);
      c.vs_fp32 =
          std::max(c.vs_fp32, ops::compare(r.decode_outputs[idx],
                                           fp32_model.forward(r.decode_inputs[idx], o.prompt + i))
                                  .relative_error);
    }
  }
  return c;
}

// Prints the prefill and decode rates, the MoE routing and the check's verdict.
void report_results(const RunOptions& o, const ops::TransformerConfig& config, DType dtype,
                    std::int64_t steps, const Runs& r, const Check& c, std::ostream& out) {
  const double prefill_s = median(r.prefill_times);
  const double prefill_flops = config.flops(o.batch, o.prompt, 0);
  const double prefill_tokens = static_cast<double>(o.batch * o.prompt);
  out << fmt::format(
      "\nprefill  {} x {} tokens: {:.2f} ms (median of {}), {:.0f} tokens/s, {:.2f} GFLOP/s\n",
      o.batch, o.prompt, prefill_s * 1e3, o.repeats, prefill_tokens / prefill_s,
      prefill_flops / prefill_s / 1e9);
  if (steps > 0) {
    const double step_s = median(r.decode_times);
    out << fmt::format(
        "decode   {} steps x {} sequences: {:.3f} ms per step (median), {:.0f} tokens/s, "
        "{:.2f} GFLOP/s, {:.2f} GB/s of weights and cache\n",
        steps, o.batch, step_s * 1e3, static_cast<double>(o.batch * steps) / r.decode_seconds,
        r.decode_flops / r.decode_seconds / 1e9, r.decode_bytes / r.decode_seconds / 1e9);
  }
  if (!r.prefill_stats.tokens_per_expert.empty()) {
    out << fmt::format(
        "moe      prefill routing: tokens per expert [{}] (summed over MoE layers), {} dropped\n",
        fmt::join(r.prefill_stats.tokens_per_expert, ", "), r.prefill_stats.dropped);
  }
  if (c.checked) {
    out << fmt::format(
        "check    max relative error vs the dense model: prefill {}, decode {} (bound {:.0e}): "
        "{}\n",
        c.check.error_text("prefill"), steps > 0 ? c.check.error_text("decode") : "-", c.bound,
        c.check.verdict());
    if (dtype != DType::kF32) {
      out << fmt::format(
          "         max relative error vs the fp32 model (what {} weights cost{}): {:.2e}\n",
          to_string(dtype), config.moe_every > 0 ? ", MoE routing included" : "", c.vs_fp32);
    }
  } else if (c.moe_rounded && !o.no_check) {
    out << fmt::format(
        "check    skipped: with {} weights the MoE routing of near-tied experts can differ from "
        "the float64 reference's (use --dtype f16 or f32, or --moe-every 0, for a checked run)\n",
        to_string(dtype));
  } else {
    out << "check    skipped (--no-check)\n";
  }
}

// --json: the run, its plans and its check as one JSON document.
void write_json(const RunOptions& o, const runtime::DeviceMesh& mesh,
                const ops::TransformerConfig& config, DType dtype, std::int64_t steps,
                const ops::Program& prefill_program, const ops::Program* decode_program,
                const Runs& r, const Check& c) {
  std::ofstream file(o.json);
  NUMESH_CHECK(file.is_open(), IoError, "cannot write --json file '{}'", o.json);
  const double prefill_s = median(r.prefill_times);
  const double prefill_flops = config.flops(o.batch, o.prompt, 0);
  const double prefill_tokens = static_cast<double>(o.batch * o.prompt);
  nlohmann::json j{{"mesh", {{"names", mesh.mesh().names()}, {"sizes", mesh.mesh().sizes()}}},
                   {"mode", o.mode},
                   {"dtype", to_string(dtype)},
                   {"parameters", config.parameters()},
                   {"prefill",
                    {{"tokens", o.batch * o.prompt},
                     {"median_seconds", prefill_s},
                     {"tokens_per_second", prefill_tokens / prefill_s},
                     {"gflops", prefill_flops / prefill_s / 1e9}}},
                   {"plans", {prefill_program.plan().to_json()}}};
  if (steps > 0) {
    j["decode"] = {{"steps", steps},
                   {"median_step_seconds", median(r.decode_times)},
                   {"tokens_per_second", static_cast<double>(o.batch * steps) / r.decode_seconds},
                   {"gflops", r.decode_flops / r.decode_seconds / 1e9},
                   {"gbytes_per_second", r.decode_bytes / r.decode_seconds / 1e9}};
    j["plans"].push_back(decode_program->plan().to_json());
  }
  if (c.checked) {
    j["check"] = c.check.to_json();
    j["check"]["prefill_relative_error"] = c.check.relative_error("prefill");
    j["check"]["decode_relative_error"] = c.check.relative_error("decode");
    if (dtype != DType::kF32) j["check"]["fp32_model_relative_error"] = c.vs_fp32;
  }
  j["moe_prefill_tokens_per_expert"] = r.prefill_stats.tokens_per_expert;
  file << j.dump(2) << "\n";
}

}  // namespace

CLI::App* add_run_command(CLI::App& app, RunOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "run",
      "The main job: lay this machine's devices into a mesh, compile a small transformer (SwiGLU "
      "and "
      "MoE blocks, random weights) sharded over it, run prefill and decode steps, check every "
      "output "
      "against the dense single-device model, and report the plan and the throughput.");
  cmd->footer(R"(Modes: decode (default) runs the prompt then --steps decode steps, each feeding the
last output back in; prefill runs the prompt only; train runs the prompt forward with train-mode
axes (numesh run runs no backward pass; numesh train does); dim:1 is eformer's integer mode on the activations [B, T, H]:
like decode, but each call's mode is inferred from T (decode for steps, train for the prompt).
Axes come from eformer's semantic axes resolved in the mode:
BATCH splits sequences, QUERY_LENGTH their tokens (sequence parallel), HEAD the attention heads,
MLP_INTERMEDIATE the MLP, EXPERT the experts; ColumnWise's first axes store the MLP weights split.
Exit status: 0; 1 when an output differs from the dense model beyond 1e-4 relative; 2 for bad input.

Examples:
  numesh run
  numesh run --dims 2,1,1 --steps 64 --batch 8
  numesh run --synthetic 'numa:2 core:2 pu:1' --dims 1,2,2 --hidden 256 --plan
  numesh run --mode prefill --prompt 512 --json run.json)");
  add_mesh_options(*cmd, o.mesh, /*with_threads=*/true);
  cmd->add_option("--mode", o.mode, "train, prefill, decode or dim:N (eformer's integer mode)")
      ->capture_default_str();
  cmd->add_option("--paxis-json", o.paxis_json,
                  "JSON file with PartitionAxis fields (eformer's defaults otherwise)");
  cmd->add_option("--set", o.sets, "field=value for one PartitionAxis field, repeatable");
  cmd->add_option("--batch", o.batch, "Sequences")->capture_default_str();
  cmd->add_option("--prompt", o.prompt, "Prompt tokens per sequence (prefill)")
      ->capture_default_str();
  cmd->add_option("--steps", o.steps, "Decode steps")->capture_default_str();
  cmd->add_option("--hidden", o.hidden, "Hidden size H")->capture_default_str();
  cmd->add_option("--layers", o.layers, "Blocks")->capture_default_str();
  cmd->add_option("--heads", o.heads, "Query heads")->capture_default_str();
  cmd->add_option("--kv-heads", o.kv_heads, "Key/value heads (divides --heads)")
      ->capture_default_str();
  cmd->add_option("--head-dim", o.head_dim, "Per-head dim (even: RoPE)")->capture_default_str();
  cmd->add_option("--ffn", o.ffn, "Intermediate size of the dense SwiGLU MLPs")
      ->capture_default_str();
  cmd->add_option("--experts", o.experts, "Experts per MoE layer")->capture_default_str();
  cmd->add_option("--top-k", o.top_k, "Experts per token")->capture_default_str();
  cmd->add_option("--moe-ffn", o.moe_ffn, "Intermediate size of each expert")
      ->capture_default_str();
  cmd->add_option("--moe-every", o.moe_every, "Every n-th block is MoE (0: none)")
      ->capture_default_str();
  cmd->add_option("--capacity", o.capacity, "MoE capacity factor (0: dropless)")
      ->capture_default_str();
  add_kv_layout_option(*cmd, o.kv_layout);
  cmd->add_option("--dtype", o.dtype,
                  fmt::format("Weights' storage dtype: {} (norms and routers stay f32; bf16 "
                              "weights multiply bf16-rounded activations, the block formats' "
                              "activations quantized to 8 bits a block of 32; sums are f32)",
                              dtype_choices()))
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "Seed of the weights and inputs")->capture_default_str();
  cmd->add_option("--repeats", o.repeats, "Timed prefill runs (median)")->capture_default_str();
  cmd->add_flag("--no-check", o.no_check, "Skip the comparison with the dense model");
  cmd->add_flag("--plan", o.plan, "Print both programs' full plans (every tensor and collective)");
  cmd->add_option("--json", o.json, "Write the summary as JSON to FILE");
  cmd->add_flag("--quiet", o.quiet, "No progress line on stderr");
  return cmd;
}

int run_run(const RunOptions& o, std::ostream& out) {
  // Everything the options decide is validated before any device is created.
  const sharding::ModeArg mode = parse_run_mode(o.mode);
  // An integer mode runs prompt and steps, each call in the mode its activations infer.
  const bool decode = mode.is_dim() || mode.mode() == sharding::Mode::kDecode;
  const ops::KvLayout layout = parse_kv_layout(o.kv_layout);
  const DType dtype = parse_dtype(o.dtype);
  NUMESH_CHECK(
      o.batch > 0 && o.prompt > 0 && o.steps >= 0 && o.repeats > 0, ValueError,
      "--batch {}, --prompt {} and --repeats {} must be positive and --steps {} not negative",
      o.batch, o.prompt, o.repeats, o.steps);
  const ops::TransformerConfig config = model_config(o);
  const sharding::PartitionManager pm(build_paxis(o.paxis_json, o.sets));
  const ops::ModelAxes axes = ops::ModelAxes::resolve(pm, mode, o.batch, o.hidden);
  const std::int64_t steps = decode ? o.steps : 0;
  const std::int64_t max_len = o.prompt + steps;

  const runtime::DeviceMesh mesh = make_mesh(o.mesh);
  report_setup(o, mesh, config, dtype, axes, out);

  const Progress progress(o.quiet);
  progress.show("building weights ...");
  ops::TransformerWeights weights = ops::TransformerWeights::random(config, o.seed);
  weights.store_as(dtype);
  progress.show("laying out weights ...");
  ops::ShardedTransformer model(mesh, config, weights, o.batch, max_len, axes, layout);
  progress.show("compiling ...");
  const auto t_compile = Clock::now();
  ops::Program& prefill_program = model.program(o.prompt);
  ops::Program* decode_program = steps > 0 ? &model.program(1) : nullptr;
  const double compile_s = seconds_since(t_compile);
  out << fmt::format("activations {}; compiled in {:.1f} ms\n",
                     model.activation_spec(o.prompt).repr(), compile_s * 1e3);
  out << "plan " << plan_summary(prefill_program.plan()) << "\n";
  if (decode_program != nullptr) out << "plan " << plan_summary(decode_program->plan()) << "\n";
  if (o.plan) {
    out << "\n" << prefill_program.plan().text();
    if (decode_program != nullptr) out << "\n" << decode_program->plan().text();
  }
  out.flush();

  const Runs runs = run_model(o, mesh, config, model, steps, progress);
  const Check check =
      check_runs(o, mesh, config, weights, dtype, axes, steps, max_len, runs, progress);
  progress.clear();
  report_results(o, config, dtype, steps, runs, check, out);
  if (!o.json.empty() && mesh.this_rank() == 0)
    write_json(o, mesh, config, dtype, steps, prefill_program, decode_program, runs, check);
  return check.ok() ? 0 : 1;
}

}  // namespace numesh::tools
