#include "op_command.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <optional>
#include <ostream>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/lowering/attention.hpp"
#include "numesh/ops/lowering/mlp.hpp"
#include "numesh/ops/lowering/moe.hpp"
#include "numesh/ops/npy.hpp"
#include "numesh/ops/lowering/transformer.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/sharding/partition_manager.hpp"
#include "numesh/ops/reference/mlp.hpp"
#include "numesh/ops/reference/attention.hpp"
#include "numesh/ops/reference/moe.hpp"
#include "numesh/ops/reference/transformer.hpp"
#include "cli_text.hpp"
#include "collective_bench.hpp"
#include "paxis_options.hpp"
#include "reference_check.hpp"
#include "resolve_command.hpp"

namespace numesh::tools {

namespace {

namespace fs = std::filesystem;
using runtime::HostTensor;

// Sharded reductions re-associate fp32 sums; docs/ops.md gives each operator's bound.
constexpr double kCheckBound = 1e-4;

// The input files of each op; `optional` ones decide the variant when present.
struct Inputs {
  fs::path dir;
  HostTensor load(const std::string& name) const { return ops::load_npy(dir / (name + ".npy")); }
  bool has(const std::string& name) const { return fs::exists(dir / (name + ".npy")); }
};

void require_files(const Inputs& in, std::string_view op, const std::vector<std::string>& names) {
  std::vector<std::string> missing;
  for (const std::string& n : names) {
    if (!in.has(n)) missing.push_back(n + ".npy");
  }
  NUMESH_CHECK(missing.empty(), IoError, "op {}: missing input file{} in '{}': {} (needs {}.npy; see docs/ops.md)",
               op, missing.size() > 1 ? "s" : "", in.dir.string(), fmt::join(missing, ", "),
               fmt::join(names, ".npy, "));
}

// A norm weight given as [H] or [1, H].
HostTensor as_row(HostTensor t) {
  if (t.shape.size() == 1) t.shape = {1, t.shape[0]};
  return t;
}

// Which tokens of x [B, T, H] the timed call runs, after which prefix: prefill/train run all T
// from 0; decode runs the last token after the others; insert runs [position, T) after
// [0, position).
struct TokenPlan {
  std::int64_t prefix = 0;  // tokens written to the cache first
  std::int64_t count = 0;   // tokens of the timed call, at position `prefix`
};

TokenPlan token_plan(const OpOptions& o, sharding::Mode mode, std::int64_t t) {
  switch (mode) {
    case sharding::Mode::kDecode: return {t - 1, 1};
    case sharding::Mode::kInsert: {
      const std::int64_t p = o.position < 0 ? t / 2 : o.position;
      NUMESH_CHECK(p < t, ValueError, "--position {}: x has {} tokens, insert needs at least one at or after it", p, t);
      return {p, t - p};
    }
    default:
      NUMESH_CHECK(o.position <= 0, ValueError, "--position {} applies to --mode insert only", o.position);
      return {0, t};
  }
}

ops::AttentionConfig attention_config(const OpOptions& o, const HostTensor& wq) {
  NUMESH_CHECK(o.heads > 0, ValueError, "--heads {}: attention needs the number of query heads (--heads N)", o.heads);
  const std::int64_t kv = o.kv_heads > 0 ? o.kv_heads : o.heads;
  NUMESH_CHECK(wq.shape.size() == 2 && wq.shape[1] % o.heads == 0, ShapeError,
               "wq.npy is [{}]; its columns must be --heads {} times head_dim", fmt::join(wq.shape, ", "), o.heads);
  return ops::AttentionConfig{.num_heads = o.heads,
                              .num_kv_heads = kv,
                              .head_dim = wq.shape[1] / o.heads,
                              .causal = true,
                              .q_offset = 0,
                              .rope_theta = static_cast<float>(o.rope_theta)};
}

ops::AttentionWeights attention_weights(const Inputs& in) {
  return ops::AttentionWeights{.wq = in.load("wq"), .wk = in.load("wk"), .wv = in.load("wv"), .wo = in.load("wo")};
}

ops::MoeWeights moe_weights(const Inputs& in) {
  return ops::MoeWeights{.router = in.load("router"), .gate = in.load("w_gate"), .up = in.load("w_up"),
                         .down = in.load("w_down")};
}

ops::MoeConfig moe_config(const OpOptions& o, const HostTensor& router) {
  NUMESH_CHECK(router.shape.size() == 2, ShapeError, "router.npy is [{}]; expected [H, E]",
               fmt::join(router.shape, ", "));
  return ops::MoeConfig{.num_experts = router.shape[1],
                        .top_k = o.top_k,
                        .capacity_factor = static_cast<float>(o.capacity),
                        .renormalize = !o.raw_weights};
}

// What an op run produced.
struct Result {
  HostTensor y;
  std::optional<HostTensor> want;  // the dense reference's output
  ops::ProgramPlan plan;  // a copy: the layer (and its program) dies with its branch
  double seconds = 0.0;
  std::optional<ops::MoeStats> stats;
  std::string timing_table;  // --timing: the per-node table of one more run
};

// --timing / --trace: one more run, after the timed ones, with per-node timing on (timing
// costs two clock reads per node, so the median is taken without it).
void traced_run(const OpOptions& o, ops::Program& program, const std::function<void()>& run, Result& r) {
  if (!o.timing && o.trace.empty()) return;
  program.graph().set_timing(true);
  run();
  program.graph().set_timing(false);
  if (o.timing) r.timing_table = program.graph().timing_table();
  if (!o.trace.empty()) {
    std::ofstream file(o.trace);
    NUMESH_CHECK(file.is_open(), IoError, "cannot write --trace file '{}'", o.trace);
    file << program.graph().chrome_trace() << "\n";
  }
}

}  // namespace

CLI::App* add_op_command(CLI::App& app, OpOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "op",
      "Run one layer (mlp, attention, moe or block) sharded over a mesh on weights and inputs read from "
      "a folder of .npy files; print the plan and the time, check the output against the dense "
      "reference, and write y.npy.");
  cmd->footer(R"(Input files (fp32 .npy, C order; docs/ops.md has the shapes):
  mlp        x [T, H]; GELU: w1 [H, F], w2 [F, H]; SwiGLU (when w_gate.npy exists): w_gate, w_up [H, F], w_down [F, H]
  attention  x [B, T, H], wq [H, heads*d], wk, wv [H, kv_heads*d], wo [heads*d, H]; needs --heads
  moe        x [T, H], router [H, E], w_gate, w_up [E, H, F], w_down [E, F, H]
  block      x [B, T, H], attn_norm [H], wq, wk, wv, wo, ffn_norm [H], then the MLP's
             w_gate, w_up, w_down [H, F] or, when router.npy exists, the MoE's files
Modes (attention, block): train and prefill run all T tokens from position 0; decode caches the
first T-1 and times the last one against the cache; insert caches [0, --position) and times the
chunk from --position. The output y.npy holds the timed call's tokens.
Exit status: 0; 1 when the output differs from the dense reference beyond 1e-4 relative; 2 for bad input.

Examples:
  numesh op mlp --dir weights/mlp
  numesh op attention --dir weights/attn --heads 16 --kv-heads 4 --mode decode --dims 1,1,2
  numesh op moe --dir weights/moe --top-k 2 --names dp,ep,tp --dims 1,2,1 --out /tmp/moe)");
  cmd->add_option("op", o.op, "mlp, attention, moe or block")->required();
  add_machine_options(*cmd, o.machine, /*with_threads=*/true);
  cmd->add_option("--dir", o.dir, "Folder of input .npy files")->required();
  cmd->add_option("--out", o.out, "Folder to write y.npy to (default: --dir)");
  cmd->add_option("--dims", o.dims, "Mesh dims, comma-separated; one -1 takes the rest")->capture_default_str();
  cmd->add_option("--names", o.names, "Mesh axis names, comma-separated")->capture_default_str();
  cmd->add_option("--mode", o.mode, "train, prefill, decode or insert")->capture_default_str();
  cmd->add_option("--position", o.position, "Insert mode: first position of the chunk (default: T/2)");
  cmd->add_option("--paxis-json", o.paxis_json, "JSON file with PartitionAxis fields");
  cmd->add_option("--set", o.sets, "field=value for one PartitionAxis field, repeatable");
  cmd->add_option("--heads", o.heads, "Query heads (attention, block)");
  cmd->add_option("--kv-heads", o.kv_heads, "Key/value heads (default: --heads)");
  cmd->add_option("--rope-theta", o.rope_theta, "RoPE base (0: none)")->capture_default_str();
  cmd->add_option("--top-k", o.top_k, "Experts per token (moe, block)")->capture_default_str();
  cmd->add_option("--capacity", o.capacity, "MoE capacity factor (0: dropless)")->capture_default_str();
  cmd->add_flag("--raw-weights", o.raw_weights, "MoE: use the softmax probabilities without renormalising");
  cmd->add_option("--norm-eps", o.norm_eps, "RMSNorm epsilon (block)")->capture_default_str();
  cmd->add_option("--kv-layout", o.kv_layout, "KV cache layout: bthd or bhtd")->capture_default_str();
  cmd->add_option("--repeats", o.repeats, "Timed runs (median)")->capture_default_str();
  cmd->add_flag("--no-check", o.no_check, "Skip the comparison with the dense reference");
  cmd->add_option("--json", o.json, "Write the plan, time and check as JSON to FILE");
  cmd->add_flag("--timing", o.timing, "Print when each node of one more run started and how long it took");
  cmd->add_option("--trace", o.trace, "Write that run as a Chrome trace (chrome://tracing, Perfetto) to FILE");
  return cmd;
}

int run_op(const OpOptions& o, std::ostream& out) {
  NUMESH_CHECK(o.op == "mlp" || o.op == "attention" || o.op == "moe" || o.op == "block", ValueError,
               "op '{}': expected mlp, attention, moe or block", o.op);
  const auto mode = sharding::parse_mode(o.mode);
  NUMESH_CHECK(mode.has_value(), ValueError, "--mode '{}': expected train, prefill, decode or insert", o.mode);
  NUMESH_CHECK(o.kv_layout == "bthd" || o.kv_layout == "bhtd", ValueError, "--kv-layout '{}': expected bthd or bhtd",
               o.kv_layout);
  NUMESH_CHECK(o.repeats > 0, ValueError, "--repeats {} must be positive", o.repeats, 0.0);
  const Inputs in{o.dir};
  NUMESH_CHECK(fs::is_directory(in.dir), IoError, "--dir '{}' is not a folder", o.dir);
  // Every file the op needs is checked before anything loads or runs.
  const std::vector<std::string> attention_files{"wq", "wk", "wv", "wo"};
  const std::vector<std::string> moe_files{"router", "w_gate", "w_up", "w_down"};
  std::vector<std::string> needed{"x"};
  if (o.op == "mlp") {
    const std::vector<std::string> f = in.has("w_gate") ? std::vector<std::string>{"w_gate", "w_up", "w_down"}
                                                        : std::vector<std::string>{"w1", "w2"};
    needed.insert(needed.end(), f.begin(), f.end());
  } else if (o.op == "attention") {
    needed.insert(needed.end(), attention_files.begin(), attention_files.end());
  } else if (o.op == "moe") {
    needed.insert(needed.end(), moe_files.begin(), moe_files.end());
  } else {
    needed.insert(needed.end(), {"attn_norm", "ffn_norm"});
    needed.insert(needed.end(), attention_files.begin(), attention_files.end());
    if (in.has("router")) {
      needed.insert(needed.end(), moe_files.begin(), moe_files.end());
    } else {
      needed.insert(needed.end(), {"w_gate", "w_up", "w_down"});
    }
  }
  require_files(in, o.op, needed);
  const fs::path out_dir = o.out.empty() ? in.dir : fs::path(o.out);
  NUMESH_CHECK(fs::is_directory(out_dir), IoError, "--out '{}' is not a folder", out_dir.string());
  if (!o.trace.empty()) {
    const fs::path parent = fs::absolute(o.trace).parent_path();
    NUMESH_CHECK(fs::is_directory(parent), IoError, "--trace '{}': folder '{}' does not exist", o.trace,
                 parent.string());
  }

  const sharding::PartitionManager pm(build_paxis(o.paxis_json, o.sets));
  const ops::ModelAxes axes = ops::ModelAxes::resolve(pm, *mode);
  const auto dims = parse_int_list(o.dims, "--dims");
  std::vector<std::string> names;
  for (std::string_view n : split_list(o.names)) names.emplace_back(n);
  const HostTensor x = in.load("x");
  const auto layout = o.kv_layout == "bthd" ? ops::KvLayout::kBTHD : ops::KvLayout::kBHTD;
  const bool sequence_op = o.op == "attention" || o.op == "block";
  if (sequence_op) {
    NUMESH_CHECK(x.shape.size() == 3, ShapeError, "x.npy is [{}]; {} takes x [B, T, H]", fmt::join(x.shape, ", "),
                 o.op);
  } else {
    NUMESH_CHECK(x.shape.size() == 2, ShapeError, "x.npy is [{}]; {} takes x [T, H]", fmt::join(x.shape, ", "), o.op);
  }
  const TokenPlan tp = sequence_op ? token_plan(o, *mode, x.shape[1]) : TokenPlan{0, x.shape[0]};

  const auto placement = placement_options(o.machine);
  auto devices = runtime::DeviceSet::create(load_topology(o.machine), placement);
  const auto mesh = runtime::DeviceMesh::create(devices, dims, names);
  out << fmt::format("numesh op {}: x [{}] from {}, mesh [{}], mode {}", o.op, fmt::join(x.shape, ", "),
                     in.dir.string(), axes_text(mesh.mesh()), o.mode);
  if (sequence_op) out << fmt::format(", timed tokens [{}, {})", tp.prefix, tp.prefix + tp.count);
  out << "\n";

  Result r;
  if (o.op == "mlp") {
    const bool swiglu = in.has("w_gate");
    const ops::MlpWeights w = swiglu ? ops::MlpWeights{.gate = in.load("w_gate"), .up = in.load("w_up"),
                                                       .down = in.load("w_down")}
                                     : ops::MlpWeights{.gate = {}, .up = in.load("w1"), .down = in.load("w2")};
    ops::ShardedMlp mlp(mesh, swiglu ? ops::MlpKind::kSwiGLU : ops::MlpKind::kGelu, w, x.shape[0],
                        ops::MlpAxes{.batch = axes.batch, .tensor = axes.mlp});
    r.seconds = bench::median_seconds([&] { r.y = mlp.forward(x); }, o.repeats, 0.0);
    traced_run(o, mlp.program(), [&] { mlp.forward(x); }, r);
    r.plan = mlp.program().plan();
    if (!o.no_check) {
      const auto m = [](const HostTensor& t) {
        return ops::RowMatrix(Eigen::Map<const ops::RowMatrix>(t.data.data(), t.shape[0], t.shape[1]));
      };
      const ops::RowMatrix want = swiglu ? ops::mlp_swiglu_reference(m(x), m(w.gate), m(w.up), m(w.down))
                                         : ops::mlp_gelu_reference(m(x), m(w.up), m(w.down));
      r.want = HostTensor{.shape = x.shape, .data = std::vector<float>(want.data(), want.data() + want.size())};
    }
    out << "\n" << r.plan.text();
  } else if (o.op == "moe") {
    const ops::MoeWeights w = moe_weights(in);
    const ops::MoeConfig c = moe_config(o, w.router);
    ops::ShardedMoe moe(mesh, c, w, x.shape[0],
                        ops::MoeAxes{.batch = axes.batch, .expert = axes.expert, .tensor = axes.expert_tensor});
    r.seconds = bench::median_seconds([&] { r.y = moe.forward(x); }, o.repeats, 0.0);
    traced_run(o, moe.program(), [&] { moe.forward(x); }, r);
    r.plan = moe.program().plan();
    r.stats = moe.stats();
    if (!o.no_check) {
      // One routing group per split of the tokens over the batch axes (from the mesh, not the layer).
      const std::int64_t groups = split_count(mesh.mesh(), axes.batch, x.shape[0]), per = x.shape[0] / groups,
                         h = x.shape[1];
      HostTensor want = HostTensor::zeros(x.shape);
      for (std::int64_t g = 0; g < groups; ++g) {
        const ops::RowMatrix yg =
            ops::moe_reference(Eigen::Map<const ops::RowMatrix>(x.data.data() + g * per * h, per, h), w, c);
        std::copy(yg.data(), yg.data() + yg.size(), want.data.begin() + g * per * h);
      }
      r.want = std::move(want);
    }
    out << "\n" << r.plan.text();
  } else if (o.op == "attention") {
    const ops::AttentionWeights w = attention_weights(in);
    const ops::AttentionConfig c = attention_config(o, w.wq);
    const std::int64_t cache = *mode == sharding::Mode::kTrain ? 0 : x.shape[1];
    ops::ShardedAttention layer(mesh, c, w, x.shape[0], cache, ops::AttentionAxes{.batch = axes.batch, .heads = axes.heads},
                                layout);
    if (tp.prefix > 0) layer.forward(ops::slice_tokens(x, 0, tp.prefix), 0);
    const HostTensor chunk = ops::slice_tokens(x, tp.prefix, tp.count);
    r.seconds = bench::median_seconds([&] { r.y = layer.forward(chunk, tp.prefix); }, o.repeats, 0.0);
    traced_run(o, layer.program(tp.count), [&] { layer.forward(chunk, tp.prefix); }, r);
    r.plan = layer.program(tp.count).plan();
    if (!o.no_check) r.want = ops::slice_tokens(ops::attention_layer_reference(x, w, c), tp.prefix, tp.count);
    out << "\n" << r.plan.text();
  } else {  // block
    ops::TransformerConfig c;
    c.layers = 1;
    c.hidden = x.shape[2];
    ops::TransformerWeights w;
    ops::BlockWeights b;
    b.attn_norm = as_row(in.load("attn_norm"));
    b.ffn_norm = as_row(in.load("ffn_norm"));
    b.attention = attention_weights(in);
    c.attention = attention_config(o, b.attention.wq);
    c.norm_eps = static_cast<float>(o.norm_eps);
    if (in.has("router")) {
      b.moe = moe_weights(in);
      c.moe = moe_config(o, b.moe.router);
      NUMESH_CHECK(b.moe.gate.shape.size() == 3, ShapeError, "w_gate.npy is [{}]; expected [E, H, F]",
                   fmt::join(b.moe.gate.shape, ", "));
      c.moe_ffn = b.moe.gate.shape[2];
      c.moe_every = 1;
    } else {
      b.mlp = ops::MlpWeights{.gate = in.load("w_gate"), .up = in.load("w_up"), .down = in.load("w_down")};
      NUMESH_CHECK(b.mlp.up.shape.size() == 2, ShapeError, "w_up.npy is [{}]; expected [H, F]",
                   fmt::join(b.mlp.up.shape, ", "));
      c.ffn = b.mlp.up.shape[1];
      c.moe_every = 0;
    }
    w.blocks.push_back(std::move(b));  // no final norm: a bare block
    ops::ShardedTransformer model(mesh, c, w, x.shape[0], x.shape[1], axes, layout);
    if (tp.prefix > 0) model.forward(ops::slice_tokens(x, 0, tp.prefix), 0);
    const HostTensor chunk = ops::slice_tokens(x, tp.prefix, tp.count);
    r.seconds = bench::median_seconds([&] { r.y = model.forward(chunk, tp.prefix); }, o.repeats, 0.0);
    traced_run(o, model.program(tp.count), [&] { model.forward(chunk, tp.prefix); }, r);
    r.plan = model.program(tp.count).plan();
    if (c.moe_every > 0) r.stats = model.moe_stats();
    if (!o.no_check) {
      ops::TransformerReference reference(
          c, w, x.shape[0], x.shape[1], split_count(mesh.mesh(), axes.batch, x.shape[0]),
          sequence_groups(mesh.mesh(), axes.sequence));
      if (tp.prefix > 0) reference.forward(ops::slice_tokens(x, 0, tp.prefix), 0);
      r.want = reference.forward(chunk, tp.prefix);
    }
    out << "\n" << r.plan.text();
  }

  const double flops = std::accumulate(r.plan.flops.begin(), r.plan.flops.end(), 0.0);
  out << fmt::format("\ntime     {:.3f} ms (median of {}), {:.2f} GFLOP/s summed over devices\n", r.seconds * 1e3,
                     o.repeats, flops / r.seconds / 1e9);
  if (r.stats) {
    out << fmt::format("routing  tokens per expert [{}], {} dropped{}\n", fmt::join(r.stats->tokens_per_expert, ", "),
                       r.stats->dropped,
                       r.stats->capacity > 0 ? fmt::format(" (capacity {} per group)", r.stats->capacity) : "");
  }
  if (!r.timing_table.empty()) out << "\nper-node timing of one more run:\n" << r.timing_table;
  if (!o.trace.empty()) out << fmt::format("trace    {} (one more run; chrome://tracing or Perfetto)\n", o.trace);
  ReferenceCheck check(kCheckBound);
  if (r.want) {
    check.add("output", r.y, *r.want);
    out << fmt::format("check    max relative error vs the dense reference {} (bound {:.0e}): {}\n",
                       check.error_text("output"), kCheckBound, check.verdict());
  }
  const bool ok = !r.want || check.ok();
  const fs::path y_file = out_dir / "y.npy";
  ops::save_npy(y_file, r.y);
  out << fmt::format("wrote    {} [{}]\n", y_file.string(), fmt::join(r.y.shape, ", "));
  if (!o.json.empty()) {
    std::ofstream file(o.json);
    NUMESH_CHECK(file.is_open(), IoError, "cannot write --json file '{}'", o.json);
    nlohmann::json j{{"op", o.op}, {"mode", o.mode}, {"median_seconds", r.seconds}, {"plan", r.plan.to_json()},
                     {"output", y_file.string()}};
    if (r.want) {
      j["check"] = check.to_json();
      j["check"]["relative_error"] = check.relative_error("output");
    }
    if (r.stats) j["tokens_per_expert"] = r.stats->tokens_per_expert;
    file << j.dump(2) << "\n";
  }
  return ok ? 0 : 1;
}

}  // namespace numesh::tools
