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
#include "numesh/core/check.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/timing.hpp"
#include "numesh/core/units.hpp"
#include "numesh/ops/compare.hpp"
#include "numesh/ops/lowering/transformer.hpp"
#include "numesh/ops/reference/transformer.hpp"
#include "numesh/runtime/device_mesh.hpp"
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
  cmd->add_option("--kv-layout", o.kv_layout, "KV cache layout: bthd or bhtd")
      ->capture_default_str();
  cmd->add_option("--dtype", o.dtype,
                  "Weights' storage dtype: f32, bf16 or f16 (norms and routers stay f32; bf16 "
                  "weights multiply "
                  "bf16-rounded activations; sums are f32)")
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
  const sharding::PartitionManager pm(build_paxis(o.paxis_json, o.sets));
  const ops::ModelAxes axes = ops::ModelAxes::resolve(pm, mode, o.batch, o.hidden);
  const std::int64_t steps = decode ? o.steps : 0;
  const std::int64_t max_len = o.prompt + steps;

  const runtime::DeviceMesh mesh = make_mesh(o.mesh);
  const runtime::PlacementOptions& placement = mesh.devices().options();
  int threads = 0;
  for (std::int64_t s = 0; s < mesh.size(); ++s) threads += mesh.device(s).spec().threads;
  out << fmt::format("numesh run: {} device{} ({} policy, {} thread{}), mesh [{}], mode {}\n",
                     mesh.size(), mesh.size() == 1 ? "" : "s", runtime::to_string(placement.policy),
                     threads, threads == 1 ? "" : "s", axes_text(mesh.mesh()), o.mode);
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

  // Prefill: the prompt at position 0, repeated (it rewrites the same cache positions).
  const runtime::HostTensor prompt = random_tokens(o.batch, o.prompt, o.hidden, o.seed + 1);
  std::vector<double> prefill_times;
  runtime::HostTensor y;
  for (int r = 0; r < o.repeats; ++r) {
    progress.show(fmt::format("prefill {}/{} ...", r + 1, o.repeats));
    const auto t0 = Clock::now();
    y = model.forward(prompt, 0);
    prefill_times.push_back(seconds_since(t0));
  }
  const ops::MoeStats prefill_stats = model.moe_stats();
  const double prefill_s = median(prefill_times);
  const double prefill_flops = config.flops(o.batch, o.prompt, 0);

  // Decode: each step feeds the last output back in.
  std::vector<runtime::HostTensor> decode_inputs, decode_outputs;
  std::vector<double> decode_times;
  double decode_flops = 0.0, decode_bytes = 0.0;
  runtime::HostTensor next = last_token(y);
  const auto t_decode = Clock::now();
  for (std::int64_t i = 0; i < steps; ++i) {
    const std::int64_t position = o.prompt + i;
    const auto t0 = Clock::now();
    runtime::HostTensor step_y = model.forward(next, position);
    decode_times.push_back(seconds_since(t0));
    decode_flops += config.flops(o.batch, 1, position);
    decode_bytes += static_cast<double>(model.decode_bytes_per_device(position)) *
                    static_cast<double>(mesh.size());
    decode_inputs.push_back(std::move(next));
    next = last_token(step_y);
    decode_outputs.push_back(std::move(step_y));
    const double elapsed = seconds_since(t_decode);
    progress.show(fmt::format("decode {}/{}  {:.0f} tokens/s", i + 1, steps,
                              static_cast<double>(o.batch * (i + 1)) / elapsed));
  }
  const double decode_s = seconds_since(t_decode);

  // The check: the dense model on the same inputs (teacher-forced, so each step is compared
  // on its own rather than as a drifting trajectory).
  const double bound = dtype == DType::kBF16 ? kBf16CheckBound : kCheckBound;
  // A routing decision is discontinuous: those bf16 boundary flips move a router's logits enough to
  // swap near-tied experts, and a swapped expert changes a token's output entirely. MoE models
  // with bf16 weights are therefore not compared element-wise (the tests check them on small
  // models, where no decision is that close).
  const bool moe_bf16 =
      dtype == DType::kBF16 && config.moe_every > 0 && config.moe_every <= config.layers;
  const bool checked = !o.no_check && !moe_bf16;
  ReferenceCheck check(bound);
  double vs_fp32 = 0.0;
  if (checked) {
    progress.show("checking against the dense model ...");
    // The reference's MoE routing groups follow from the mesh and the axes: sequences split
    // over the batch axes, tokens over the sequence axis.
    ops::TransformerReference reference(config, weights, o.batch, max_len,
                                        split_count(mesh.mesh(), axes.batch, o.batch),
                                        sequence_groups(mesh.mesh(), axes.sequence));
    check.add("prefill", y, reference.forward(prompt, 0));
    for (std::int64_t i = 0; i < steps; ++i) {
      const auto idx = static_cast<std::size_t>(i);
      check.add("decode", decode_outputs[idx], reference.forward(decode_inputs[idx], o.prompt + i));
    }
    if (dtype != DType::kF32) {
      // What storing the weights in 16 bits costs: the same inputs through the fp32 dense model.
      progress.show("measuring the distance from the fp32 model ...");
      ops::TransformerWeights fp32_weights = weights;
      fp32_weights.store_as(DType::kF32);
      ops::TransformerReference fp32_model(config, fp32_weights, o.batch, max_len,
                                           split_count(mesh.mesh(), axes.batch, o.batch),
                                           sequence_groups(mesh.mesh(), axes.sequence));
      vs_fp32 = std::max(vs_fp32, ops::compare(y, fp32_model.forward(prompt, 0)).relative_error);
      for (std::int64_t i = 0; i < steps; ++i) {
        const auto idx = static_cast<std::size_t>(i);
        vs_fp32 = std::max(
            vs_fp32,
            ops::compare(decode_outputs[idx], fp32_model.forward(decode_inputs[idx], o.prompt + i))
                .relative_error);
      }
    }
  }
  const bool ok = !checked || check.ok();
  progress.clear();

  const double prefill_tokens = static_cast<double>(o.batch * o.prompt);
  out << fmt::format(
      "\nprefill  {} x {} tokens: {:.2f} ms (median of {}), {:.0f} tokens/s, {:.2f} GFLOP/s\n",
      o.batch, o.prompt, prefill_s * 1e3, o.repeats, prefill_tokens / prefill_s,
      prefill_flops / prefill_s / 1e9);
  if (steps > 0) {
    const double step_s = median(decode_times);
    out << fmt::format(
        "decode   {} steps x {} sequences: {:.3f} ms per step (median), {:.0f} tokens/s, "
        "{:.2f} GFLOP/s, {:.2f} GB/s of weights and cache\n",
        steps, o.batch, step_s * 1e3, static_cast<double>(o.batch * steps) / decode_s,
        decode_flops / decode_s / 1e9, decode_bytes / decode_s / 1e9);
  }
  if (!prefill_stats.tokens_per_expert.empty()) {
    out << fmt::format(
        "moe      prefill routing: tokens per expert [{}] (summed over MoE layers), {} dropped\n",
        fmt::join(prefill_stats.tokens_per_expert, ", "), prefill_stats.dropped);
  }
  if (checked) {
    out << fmt::format(
        "check    max relative error vs the dense model: prefill {}, decode {} (bound {:.0e}): "
        "{}\n",
        check.error_text("prefill"), steps > 0 ? check.error_text("decode") : "-", bound,
        check.verdict());
    if (dtype != DType::kF32) {
      out << fmt::format(
          "         max relative error vs the fp32 model (what {} weights cost{}): {:.2e}\n",
          to_string(dtype), config.moe_every > 0 ? ", MoE routing included" : "", vs_fp32);
    }
  } else if (moe_bf16 && !o.no_check) {
    out << "check    skipped: with bf16 weights the MoE routing of near-tied experts can differ "
           "from the float64 "
           "reference's (use --dtype f16 or f32, or --moe-every 0, for a checked run)\n";
  } else {
    out << "check    skipped (--no-check)\n";
  }

  if (!o.json.empty()) {
    std::ofstream file(o.json);
    NUMESH_CHECK(file.is_open(), IoError, "cannot write --json file '{}'", o.json);
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
                     {"median_step_seconds", median(decode_times)},
                     {"tokens_per_second", static_cast<double>(o.batch * steps) / decode_s},
                     {"gflops", decode_flops / decode_s / 1e9},
                     {"gbytes_per_second", decode_bytes / decode_s / 1e9}};
      j["plans"].push_back(decode_program->plan().to_json());
    }
    if (checked) {
      j["check"] = check.to_json();
      j["check"]["prefill_relative_error"] = check.relative_error("prefill");
      j["check"]["decode_relative_error"] = check.relative_error("decode");
      if (dtype != DType::kF32) j["check"]["fp32_model_relative_error"] = vs_fp32;
    }
    j["moe_prefill_tokens_per_expert"] = prefill_stats.tokens_per_expert;
    file << j.dump(2) << "\n";
  }
  return ok ? 0 : 1;
}

}  // namespace numesh::tools
