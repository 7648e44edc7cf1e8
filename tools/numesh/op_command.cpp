#include "op_command.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"
#include "numesh/models/formats/npy.hpp"
#include "numesh/ops/compare.hpp"
#include "numesh/ops/lowering/layer_table.hpp"
#include "numesh/ops/lowering/model_axes.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/sharding/partition_manager.hpp"
#include "parsers.hpp"
#include "paxis_options.hpp"
#include "reference_check.hpp"
#include "render.hpp"

namespace numesh::tools {

namespace {

namespace fs = std::filesystem;
using runtime::HostTensor;

// Sharded reductions re-associate fp32 sums; docs/ops.md gives each operator's bound.
constexpr double kCheckBound = 1e-4;

// The folder of input .npy files (--dir), as the layer table reads its inputs.
class OpInputs final : public ops::LayerInputs {
 public:
  OpInputs(fs::path dir, bool refuse_nonfinite, std::ostream& notes)
      : dir_(std::move(dir)), refuse_nonfinite_(refuse_nonfinite), notes_(notes) {}

  const fs::path& dir() const { return dir_; }

  // `name`.npy, loaded. Non-finite values in it are noted, counted and located ("note: x.npy
  // holds 1 non-finite value of 24 (the first, nan, at [1, 2])"), or refused (ValueError with
  // that text) under --refuse-nonfinite: a NaN in a weight otherwise surfaces only as a failed
  // check.
  HostTensor load(const std::string& name) const override {
    HostTensor t = models::load_npy(dir_ / (name + ".npy"));
    // ops::compare counts and locates a reference's non-finite values; against itself nothing
    // else differs.
    const ops::Comparison found = ops::compare(t, t);
    if (found.nonfinite_reference == 0) return t;
    const std::string text = fmt::format(
        "{}.npy holds {} non-finite value{} of {} (the first, {}, at {})", name,
        found.nonfinite_reference, found.nonfinite_reference == 1 ? "" : "s", t.data.size(),
        t.data[static_cast<std::size_t>(found.first_nonfinite_reference)],
        found.index_text(found.first_nonfinite_reference));
    NUMESH_CHECK(!refuse_nonfinite_, ValueError, "{}; --refuse-nonfinite refuses it", text);
    notes_ << "note: " << text << "\n";
    return t;
  }
  bool has(const std::string& name) const override { return fs::exists(dir_ / (name + ".npy")); }
  std::string label(std::string_view name) const override { return fmt::format("{}.npy", name); }
  OptionStyle option_style() const override { return OptionStyle::kFlag; }

 private:
  fs::path dir_;
  bool refuse_nonfinite_;
  std::ostream& notes_;
};

void require_files(const OpInputs& in, std::string_view op, const std::vector<std::string>& names) {
  std::vector<std::string> missing;
  for (const std::string& n : names) {
    if (!in.has(n)) missing.push_back(n + ".npy");
  }
  NUMESH_CHECK(missing.empty(), IoError,
               "op {}: missing input file{} in '{}': {} (needs {}.npy; see docs/ops.md)", op,
               missing.size() > 1 ? "s" : "", in.dir().string(), fmt::join(missing, ", "),
               fmt::join(names, ".npy, "));
}

// The "Input files" lines of --help, one entry of ops::layer_table() each: the name in a column of
// 10, the text after it, continuation lines indented under the text.
std::string inputs_help() {
  std::string out;
  for (const ops::LayerEntry& e : ops::layer_table()) {
    std::string text(e.inputs_help);
    for (std::size_t at = text.find('\n'); at != std::string::npos; at = text.find('\n', at + 1)) {
      text.insert(at + 1, std::string(13, ' '));
    }
    out += fmt::format("  {:<10} {}\n", e.name, text);
  }
  return out;
}

}  // namespace

CLI::App* add_op_command(CLI::App& app, OpOptions& o) {
  const std::string names = ops::layer_names_text();
  CLI::App* cmd = app.add_subcommand(
      "op",
      fmt::format(
          "Run one layer ({}) sharded over a mesh on weights and inputs read from a folder of .npy "
          "files; print the plan and the time, check the output against the dense reference, and "
          "write y.npy.",
          names));
  cmd->footer(
      "Input files (fp32 .npy, C order; docs/ops.md has the shapes):\n" + inputs_help() +
      R"(Modes (attention, block): train and prefill run all T tokens from position 0; decode caches the
first T-1 and times the last one against the cache; insert caches [0, --position) and times the
chunk from --position. The output y.npy holds the timed call's tokens.
Exit status: 0; 1 when the output differs from the dense reference beyond 1e-4 relative; 2 for bad input.

Examples:
  numesh op mlp --dir weights/mlp
  numesh op attention --dir weights/attn --heads 16 --kv-heads 4 --mode decode --dims 1,1,2
  numesh op moe --dir weights/moe --top-k 2 --names dp,ep,tp --dims 1,2,1 --out /tmp/moe)");
  cmd->add_option("op", o.op, names)->required();
  add_machine_options(*cmd, o.mesh.machine, /*with_threads=*/true);
  cmd->add_option("--dir", o.dir, "Folder of input .npy files")->required();
  cmd->add_option("--out", o.out, "Folder to write y.npy to (default: --dir)");
  // After --dir and --out, as --help has always listed them.
  add_mesh_shape_options(*cmd, o.mesh);
  cmd->add_option("--mode", o.mode, "train, prefill, decode or insert")->capture_default_str();
  cmd->add_option("--position", o.position,
                  "Insert mode: first position of the chunk (default: T/2)");
  cmd->add_option("--paxis-json", o.paxis_json, "JSON file with PartitionAxis fields");
  cmd->add_option("--set", o.sets, "field=value for one PartitionAxis field, repeatable");
  cmd->add_option("--heads", o.layer.heads, "Query heads (attention, block)");
  cmd->add_option("--kv-heads", o.layer.kv_heads, "Key/value heads (default: --heads)");
  cmd->add_option("--rope-theta", o.layer.rope_theta, "RoPE base (0: none)")->capture_default_str();
  cmd->add_option("--top-k", o.layer.top_k, "Experts per token (moe, block)")
      ->capture_default_str();
  cmd->add_option("--capacity", o.layer.capacity, "MoE capacity factor (0: dropless)")
      ->capture_default_str();
  cmd->add_flag("--raw-weights", o.layer.raw_weights,
                "MoE: use the softmax probabilities without renormalising");
  cmd->add_option("--norm-eps", o.layer.norm_eps, "RMSNorm epsilon (block)")->capture_default_str();
  cmd->add_option("--kv-layout", o.kv_layout, "KV cache layout: bthd or bhtd")
      ->capture_default_str();
  cmd->add_option("--dtype", o.dtype,
                  fmt::format("Storage dtype of the operator's matrices: {} (the .npy files are "
                              "f32 and are rounded or quantized; the reference uses the stored "
                              "weights)",
                              dtype_choices()))
      ->capture_default_str();
  cmd->add_option("--repeats", o.layer.repeats, "Timed runs (median)")->capture_default_str();
  cmd->add_flag("--no-check", o.layer.no_check, "Skip the comparison with the dense reference");
  cmd->add_flag("--refuse-nonfinite", o.refuse_nonfinite,
                "Refuse an input .npy holding NaN or infinities (default: say so and run)");
  cmd->add_option("--json", o.json, "Write the plan, time and check as JSON to FILE");
  cmd->add_flag("--timing", o.layer.timing,
                "Print when each node of one more run started and how long it took");
  cmd->add_option("--trace", o.layer.trace,
                  "Write that run as a Chrome trace (chrome://tracing, Perfetto) to FILE");
  return cmd;
}

int run_op(const OpOptions& o, std::ostream& out) {
  const ops::LayerEntry* entry = ops::find_layer(o.op);
  NUMESH_CHECK(entry != nullptr, ValueError, "op '{}': expected {}", o.op, ops::layer_names_text());
  const sharding::Mode mode = parse_op_mode(o.mode);
  const ops::KvLayout layout = parse_kv_layout(o.kv_layout);
  const DType dtype = parse_dtype(o.dtype);
  NUMESH_CHECK(o.layer.repeats > 0, ValueError, "--repeats {} must be positive", o.layer.repeats);
  const OpInputs in(o.dir, o.refuse_nonfinite, out);
  NUMESH_CHECK(fs::is_directory(in.dir()), IoError, "--dir '{}' is not a folder", o.dir);
  // Every file the op needs is checked before anything loads or runs.
  require_files(in, o.op, ops::needed_inputs(*entry, in));
  const fs::path out_dir = o.out.empty() ? in.dir() : fs::path(o.out);
  NUMESH_CHECK(fs::is_directory(out_dir), IoError, "--out '{}' is not a folder", out_dir.string());
  if (!o.layer.trace.empty()) {
    const fs::path parent = fs::absolute(o.layer.trace).parent_path();
    NUMESH_CHECK(fs::is_directory(parent), IoError, "--trace '{}': folder '{}' does not exist",
                 o.layer.trace, parent.string());
  }

  const sharding::PartitionManager pm(build_paxis(o.paxis_json, o.sets));
  const ops::ModelAxes axes = ops::ModelAxes::resolve(pm, mode);
  check_mesh_options(o.mesh);  // a bad --dims is reported before the inputs load
  const HostTensor x = in.load("x");
  ops::check_x(*entry, x, in);
  const ops::TokenPlan tp = ops::token_plan(*entry, x, mode, o.position, in);

  const runtime::DeviceMesh mesh = make_mesh(o.mesh);
  out << fmt::format("numesh op {}: x [{}] from {}, mesh [{}], mode {}, {} weights", o.op,
                     fmt::join(x.shape, ", "), in.dir().string(), axes_text(mesh.mesh()), o.mode,
                     to_string(dtype));
  if (entry->sequence)
    out << fmt::format(", timed tokens [{}, {})", tp.prefix, tp.prefix + tp.count);
  out << "\n";

  const ops::LayerResult r = entry->run(ops::LayerContext{.options = o.layer,
                                                          .inputs = in,
                                                          .x = x,
                                                          .mode = mode,
                                                          .axes = axes,
                                                          .mesh = mesh,
                                                          .kv_layout = layout,
                                                          .tokens = tp,
                                                          .weights = dtype});
  out << "\n" << r.plan.text();

  const double flops = std::accumulate(r.plan.flops.begin(), r.plan.flops.end(), 0.0);
  out << fmt::format("\ntime     {:.3f} ms (median of {}), {:.2f} GFLOP/s summed over devices\n",
                     r.seconds * 1e3, o.layer.repeats, flops / r.seconds / 1e9);
  if (r.stats) {
    out << fmt::format(
        "routing  tokens per expert [{}], {} dropped{}\n",
        fmt::join(r.stats->tokens_per_expert, ", "), r.stats->dropped,
        r.stats->capacity > 0 ? fmt::format(" (capacity {} per group)", r.stats->capacity) : "");
  }
  if (!r.timing_table.empty()) out << "\nper-node timing of one more run:\n" << r.timing_table;
  if (!o.layer.trace.empty())
    out << fmt::format("trace    {} (one more run; chrome://tracing or Perfetto)\n", o.layer.trace);
  const double bound = is_element_dtype(dtype) ? kCheckBound : kBlockFormatCheckBound;
  ReferenceCheck check(bound);
  if (r.want) {
    check.add("output", r.y, *r.want);
    out << fmt::format("check    max relative error vs the dense reference {} (bound {:.0e}): {}\n",
                       check.error_text("output"), bound, check.verdict());
  }
  const bool ok = !r.want || check.ok();
  const fs::path y_file = out_dir / "y.npy";
  models::save_npy(y_file, r.y);
  out << fmt::format("wrote    {} [{}]\n", y_file.string(), fmt::join(r.y.shape, ", "));
  if (!o.json.empty()) {
    std::ofstream file(o.json);
    NUMESH_CHECK(file.is_open(), IoError, "cannot write --json file '{}'", o.json);
    nlohmann::json j{{"op", o.op},
                     {"mode", o.mode},
                     {"dtype", to_string(dtype)},
                     {"median_seconds", r.seconds},
                     {"plan", r.plan.to_json()},
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
