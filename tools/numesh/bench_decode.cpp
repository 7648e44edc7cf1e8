#include "bench_decode.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <random>
#include <string_view>
#include <utility>
#include <vector>

#include "bench_common.hpp"
#include "hidden_steps.hpp"
#include "kv_dtype_option.hpp"
#include "kv_layout_option.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/timing.hpp"
#include "numesh/diagnostics/memory_benchmark.hpp"
#include "numesh/models/engine/engine.hpp"
#include "numesh/ops/lowering/transformer.hpp"
#include "numesh/ops/transformer_config.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/sharding/partition_manager.hpp"
#include "parsers.hpp"
#include "render.hpp"

namespace numesh::tools {

namespace {

using Clock = std::chrono::steady_clock;

// The model of one size: the options with `hidden` (from the option `source`), the sizes left
// at 0 derived from it.
// Throws: ValueError naming the options and the size.
ops::TransformerConfig model_config(const BenchDecodeOptions& o, std::int64_t hidden,
                                    std::string_view source) {
  NUMESH_CHECK(hidden > 0, ValueError, "{} {} must be positive", source, hidden);
  NUMESH_CHECK(o.head_dim > 0, ValueError, "--head-dim {} must be positive", o.head_dim);
  NUMESH_CHECK(o.heads >= 0 && o.kv_heads >= 0 && o.ffn >= 0 && o.moe_ffn >= 0, ValueError,
               "--heads {}, --kv-heads {}, --ffn {} and --moe-ffn {} must not be negative (0: "
               "derived from the hidden size)",
               o.heads, o.kv_heads, o.ffn, o.moe_ffn);
  NUMESH_CHECK(o.heads > 0 || hidden % o.head_dim == 0, ValueError,
               "{} {} is not a multiple of --head-dim {}, so the heads cannot be hidden / "
               "head_dim; give --heads",
               source, hidden, o.head_dim);
  ops::TransformerConfig c;
  c.hidden = hidden;
  c.layers = o.layers;
  const std::int64_t heads = o.heads > 0 ? o.heads : hidden / o.head_dim;
  const std::int64_t kv_heads = o.kv_heads > 0 ? o.kv_heads : (heads % 4 == 0 ? heads / 4 : heads);
  c.attention =
      ops::AttentionConfig{.num_heads = heads, .num_kv_heads = kv_heads, .head_dim = o.head_dim};
  c.ffn = o.ffn > 0 ? o.ffn : 4 * hidden;
  c.moe = ops::MoeConfig{.num_experts = o.experts, .top_k = o.top_k};
  c.moe_ffn = o.moe_ffn > 0 ? o.moe_ffn
                            : std::max<std::int64_t>(1, c.ffn / std::max<std::int64_t>(1, o.top_k));
  c.moe_every = o.moe_every;
  c.validate();
  return c;
}

// The hidden sizes to run: --sweep-hidden, or --hidden alone.
std::vector<std::int64_t> hidden_sizes(const BenchDecodeOptions& o) {
  if (o.sweep_hidden.empty()) return {o.hidden};
  const std::vector<std::int64_t> sizes = parse_int_list(o.sweep_hidden, "--sweep-hidden");
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    NUMESH_CHECK(sizes[i] > 0, ValueError, "--sweep-hidden '{}': {} is not a positive hidden size",
                 o.sweep_hidden, sizes[i]);
    NUMESH_CHECK(std::find(sizes.begin(), sizes.begin() + static_cast<std::ptrdiff_t>(i),
                           sizes[i]) == sizes.begin() + static_cast<std::ptrdiff_t>(i),
                 ValueError, "--sweep-hidden '{}': {} is listed twice", o.sweep_hidden, sizes[i]);
  }
  return sizes;
}

struct DecodeFigures {
  ops::TransformerConfig config;
  DType kv_dtype = DType::kF32;
  double bytes_per_step = 0.0;  // mean over the timed steps, summed over the devices
  double median_step = 0.0;
  double min_step = 0.0;
  double gbps = 0.0;
};

// Builds the model, runs the prompt, one untimed step (compiling the one-token program) and
// `steps` timed ones.
DecodeFigures measure_decode(const runtime::DeviceMesh& mesh, const ops::TransformerConfig& config,
                             const ops::ModelAxes& axes, const BenchDecodeOptions& o,
                             ops::KvLayout layout, DType kv_dtype, DType dtype,
                             const ProgressLine& progress) {
  const std::string name = fmt::format("hidden {} {}", config.hidden, to_string(dtype));
  progress.show(fmt::format("{}: building weights ({:.1f} M parameters) ...", name,
                            static_cast<double>(config.parameters()) / 1e6));
  std::unique_ptr<ops::ShardedTransformer> model;
  {
    ops::TransformerWeights weights = ops::TransformerWeights::random(config, o.seed);
    weights.store_as(dtype);
    progress.show(fmt::format("{}: laying out weights ...", name));
    model = std::make_unique<ops::ShardedTransformer>(
        mesh, config, weights, o.batch, o.prompt + 1 + o.steps, axes, layout, kv_dtype);
  }  // the host copy of the weights is freed here: only the devices' shards stay
  progress.show(fmt::format("{}: prefill of {} x {} tokens, then {} decode steps ...", name,
                            o.batch, o.prompt, o.steps + 1));
  runtime::HostTensor next =
      last_token(model->forward(random_tokens(o.batch, o.prompt, config.hidden, o.seed + 1), 0));
  next = last_token(model->forward(next, o.prompt));  // untimed: compiles the step program
  std::vector<double> times;
  double bytes = 0.0;
  for (std::int64_t i = 0; i < o.steps; ++i) {
    progress.update(fmt::format("{}: decode step {}/{} ...", name, i + 1, o.steps));
    const std::int64_t position = o.prompt + 1 + i;
    const auto t0 = Clock::now();
    runtime::HostTensor y = model->forward(next, position);
    times.push_back(seconds_since(t0));
    bytes += static_cast<double>(model->decode_bytes_per_device(position)) *
             static_cast<double>(mesh.size());
    next = last_token(y);
  }
  DecodeFigures f;
  f.config = config;
  f.kv_dtype = kv_dtype;
  f.bytes_per_step = bytes / static_cast<double>(o.steps);
  f.median_step = median(times);
  f.min_step = *std::min_element(times.begin(), times.end());
  f.gbps = f.bytes_per_step / f.median_step / 1e9;
  return f;
}

// The options checked before a device exists: the read array's bytes, the KV layout, the
// weight dtypes (each once) and each size's model.
struct CheckedDecodeOptions {
  std::size_t bytes = 0;
  ops::KvLayout layout{};
  DType kv_dtype = DType::kF32;
  std::vector<DType> dtypes;
  std::vector<ops::TransformerConfig> configs;
};

// Checks every option and builds each size's model, in the order of their messages (the mesh
// options last).
// Throws: ValueError naming the option.
CheckedDecodeOptions check_decode_options(const BenchDecodeOptions& o) {
  NUMESH_CHECK(o.batch > 0 && o.prompt > 0 && o.steps > 0, ValueError,
               "--batch {}, --prompt {} and --steps {} must be positive", o.batch, o.prompt,
               o.steps);
  NUMESH_CHECK(o.repeats >= 1 && o.repeats <= 100000, ValueError,
               "--repeats {} must be between 1 and 100000", o.repeats);
  CheckedDecodeOptions c;
  c.bytes = parse_array_bytes("--size", o.size, std::size_t{1} << 40);
  c.layout = parse_kv_layout(o.kv_layout);
  c.kv_dtype = models::parse_kv_dtype(o.kv_dtype);
  for (std::string_view name : split_list(o.dtypes)) {
    const DType t = parse_dtype(name);
    NUMESH_CHECK(std::find(c.dtypes.begin(), c.dtypes.end(), t) == c.dtypes.end(), ValueError,
                 "--dtypes '{}': {} is listed twice", o.dtypes, to_string(t));
    c.dtypes.push_back(t);
  }
  NUMESH_CHECK(!c.dtypes.empty(), ValueError, "--dtypes '{}': no dtype given", o.dtypes);
  for (std::int64_t hidden : hidden_sizes(o)) {
    c.configs.push_back(
        model_config(o, hidden, o.sweep_hidden.empty() ? "--hidden" : "--sweep-hidden"));
  }
  check_mesh_options(o.mesh);
  return c;
}

// Each size's axes: decode mode, the default partition axes.
std::vector<ops::ModelAxes> decode_axes(const std::vector<ops::TransformerConfig>& configs,
                                        std::int64_t batch) {
  const sharding::PartitionManager pm{sharding::PartitionAxis{}};
  std::vector<ops::ModelAxes> axes;
  for (const ops::TransformerConfig& c : configs) {
    axes.push_back(
        ops::ModelAxes::resolve(pm, sharding::ModeArg(sharding::Mode::kDecode), batch, c.hidden));
  }
  return axes;
}

// Prints the devices, the mesh and the run's shape.
void report_decode_setup(const BenchDecodeOptions& o, DType kv_dtype,
                         const runtime::DeviceMesh& mesh, std::ostream& out) {
  const runtime::DeviceSet& devices = mesh.devices();
  out << fmt::format(
      "numesh bench decode: {} device{} ({} policy, {} threads), mesh [{}], batch {}, prompt {}, "
      "{} timed steps, {} KV cache\n",
      devices.size(), devices.size() == 1 ? "" : "s", runtime::to_string(devices.options().policy),
      devices.total_threads(), axes_text(mesh.mesh()), o.batch, o.prompt, o.steps,
      to_string(kv_dtype));
  write_devices_text(devices, out);
  out.flush();
}

// The devices' read bandwidth: the measurements, their sum, each device's as JSON, and the
// devices' labels by NUMA node.
struct DecodeReadBandwidth {
  diagnostics::DeviceBandwidthResult result;
  double gbps = 0.0;  // summed over the devices
  nlohmann::json devices = nlohmann::json::array();
  std::map<int, std::vector<std::string>> labels_by_node;
};

// Each device in turn reads `bytes` of its node's memory with all its threads.
DecodeReadBandwidth measure_decode_read_bandwidth(const runtime::DeviceSet& devices,
                                                  std::size_t bytes, int repeats,
                                                  const ProgressLine& progress) {
  diagnostics::MemoryBenchmarkOptions read_options;
  read_options.bytes = bytes;
  read_options.kernels = {diagnostics::MemoryKernel::kRead};
  read_options.threads = {0};
  read_options.repeats = repeats;
  read_options.progress = [&](const std::string& what) {
    progress.show(fmt::format("read bandwidth: {} ...", what));
  };
  DecodeReadBandwidth r;
  r.result = diagnostics::measure_device_bandwidth(devices, read_options);
  for (const diagnostics::BandwidthMeasurement& m : r.result.measurements) {
    const diagnostics::DeviceMemoryInfo& info =
        r.result.devices[static_cast<std::size_t>(m.device)];
    r.gbps += m.gbps;
    r.devices.push_back({{"device", m.device},
                         {"label", info.label},
                         {"numa_node", info.numa_node},
                         {"threads", m.threads},
                         {"gbps", m.gbps},
                         {"best_gbps", m.best_gbps}});
    if (info.numa_node >= 0) r.labels_by_node[info.numa_node].push_back(info.label);
  }
  return r;
}

// The report's notes: devices that share a NUMA node, and MoE blocks' bytes.
std::vector<std::string> decode_notes(const DecodeReadBandwidth& read,
                                      const ops::TransformerConfig& first) {
  std::vector<std::string> notes;
  for (const auto& [node, labels] : read.labels_by_node) {
    if (labels.size() < 2) continue;
    notes.push_back(
        fmt::format("devices {} share NUMA node {} and were measured one at a time: the sum counts "
                    "that node's memory once per device, more than they read together",
                    fmt::join(labels, ", "), node));
  }
  if (first.moe_every > 0) {
    notes.push_back(
        "MoE blocks: the bytes count every local expert's weights, more than a step whose tokens "
        "route to top-k experts reads");
  }
  return notes;
}

// Prints the read bandwidth (the sum, then each device's), the notes and the table's head.
void report_decode_read_bandwidth(const DecodeReadBandwidth& read, std::size_t bytes, int repeats,
                                  const std::vector<std::string>& notes, std::ostream& out) {
  out << fmt::format(
      "read bandwidth: {:.2f} GB/s, summed over the devices (read kernel, all threads, {} per "
      "device, "
      "median of {} pass{}):",
      read.gbps, format_bytes(bytes), repeats, repeats == 1 ? "" : "es");
  for (const diagnostics::BandwidthMeasurement& m : read.result.measurements) {
    out << fmt::format(" {} {:.2f}", read.result.devices[static_cast<std::size_t>(m.device)].label,
                       m.gbps);
  }
  out << "\n";
  for (const std::string& note : notes) out << "note: " << note << "\n";
  out << fmt::format(
      "\n{:>7} {:>7} {:>6} {:>7} {:>9} {:>5} {:>6} {:>9} {:>9} {:>9} {:>8} {:>7} {:>6}\n", "hidden",
      "ffn", "layers", "heads", "params M", "dtype", "B/wt", "MB/step", "step ms", "tokens/s",
      "GB/s", "of read", "x f32");
  out.flush();
}

// One row of the table as the JSON file records it.
nlohmann::json decode_row_json(const BenchDecodeOptions& o, const DecodeFigures& f, DType dtype,
                               double tokens_per_second, double fraction, double speedup) {
  const ops::TransformerConfig& c = f.config;
  nlohmann::json model{
      {"hidden", c.hidden},
      {"ffn", c.ffn},
      {"layers", c.layers},
      {"heads", c.attention.num_heads},
      {"kv_heads", c.attention.num_kv_heads},
      {"head_dim", c.attention.head_dim},
      {"moe_every", c.moe_every},
      {"parameters", c.parameters()},
      {"dtype", to_string(dtype)},
      {"weight_bytes", c.parameters() * traits(dtype).block_bytes / traits(dtype).block_elements},
      {"bytes_per_weight", bytes_per_weight(dtype)},
      {"batch", o.batch},
      {"prompt", o.prompt},
      {"steps", o.steps},
      {"kv_dtype", std::string(to_string(f.kv_dtype))},
      {"bytes_per_step", f.bytes_per_step},
      {"median_step_seconds", f.median_step},
      {"min_step_seconds", f.min_step},
      {"tokens_per_second", tokens_per_second},
      {"gbps", f.gbps},
      {"fraction_of_read", fraction}};
  if (speedup > 0.0 && dtype != DType::kF32) model["tokens_per_second_vs_f32"] = speedup;
  return model;
}

// Each size in each dtype: its decode measured and its row printed; returns the rows as JSON.
nlohmann::json measure_decode_rows(const BenchDecodeOptions& o, const CheckedDecodeOptions& c,
                                   const runtime::DeviceMesh& mesh,
                                   const std::vector<ops::ModelAxes>& axes, double read_gbps,
                                   const ProgressLine& progress, std::ostream& out) {
  nlohmann::json models = nlohmann::json::array();
  for (std::size_t k = 0; k < c.configs.size(); ++k) {
    double f32_tokens_per_second = 0.0;  // this size's fp32 row, when --dtypes starts with f32
    for (DType dtype : c.dtypes) {
      const DecodeFigures f =
          measure_decode(mesh, c.configs[k], axes[k], o, c.layout, c.kv_dtype, dtype, progress);
      const ops::TransformerConfig& config = f.config;
      const double fraction = f.gbps / read_gbps;
      const double tokens_per_second = static_cast<double>(o.batch) / f.median_step;
      if (dtype == DType::kF32) f32_tokens_per_second = tokens_per_second;
      const double speedup =
          f32_tokens_per_second > 0.0 ? tokens_per_second / f32_tokens_per_second : 0.0;
      out << fmt::format(
          "{:>7} {:>7} {:>6} {:>7} {:>9.2f} {:>5} {:>6.3f} {:>9.2f} {:>9.3f} {:>9.1f} {:>8.2f} "
          "{:>7.2f} {:>6}\n",
          config.hidden, config.ffn, config.layers,
          fmt::format("{}/{}", config.attention.num_heads, config.attention.num_kv_heads),
          static_cast<double>(config.parameters()) / 1e6, to_string(dtype), bytes_per_weight(dtype),
          f.bytes_per_step / 1e6, f.median_step * 1e3, tokens_per_second, f.gbps, fraction,
          speedup > 0.0 ? fmt::format("{:.2f}", speedup) : std::string("-"));
      out.flush();
      models.push_back(decode_row_json(o, f, dtype, tokens_per_second, fraction, speedup));
    }
  }
  return models;
}

// --json: the machine, the mesh, the read bandwidth, the rows, their units and the notes.
void write_decode_json(std::ofstream& json_file, const BenchDecodeOptions& o,
                       const runtime::DeviceMesh& mesh, std::size_t bytes,
                       const DecodeReadBandwidth& read, const nlohmann::json& models,
                       const std::vector<std::string>& notes) {
  nlohmann::json j{{"kind", "numesh bench decode"},
                   {"machine", machine_json(mesh.devices())},
                   {"mesh", {{"names", mesh.mesh().names()}, {"sizes", mesh.mesh().sizes()}}},
                   {"read",
                    {{"gbps", read.gbps},
                     {"array_bytes", bytes},
                     {"repeats", o.repeats},
                     {"devices", read.devices},
                     {"bandwidth", read.result.to_json()}}},
                   {"models", models},
                   {"units",
                    {{"gbps", "1e9 bytes per second of the median step"},
                     {"bytes_per_step",
                      "weights held plus the valid KV cache, summed over the devices "
                      "(ShardedTransformer::decode_bytes_per_device), mean over the timed steps"},
                     {"fraction_of_read", "gbps / read.gbps"}}},
                   {"notes", notes}};
  json_file << j.dump(2) << "\n";
}

}  // namespace

CLI::App* add_bench_decode_command(CLI::App& bench, BenchDecodeOptions& o) {
  CLI::App* cmd = bench.add_subcommand(
      "decode",
      "Decode steps of a dense transformer sharded over the devices (random weights), against "
      "the devices' read bandwidth measured in the same run: weight bytes read per second and "
      "their fraction of the read bandwidth, for one model size or a sweep.");
  cmd->footer(R"(What is measured, in one run:
  read bandwidth  each device in turn reads --size of its node's memory with all its threads
                  (numesh bench memory's read kernel, median of --repeats passes); the figure is
                  the sum over the devices. Devices sharing a NUMA node (--policy core on a
                  one-node machine) are measured one at a time, so their sum overstates what
                  the node gives them together (a note says so); --policy numa makes one
                  device per node
  decode          per model size: random weights laid out over the mesh, a prefill of --prompt
                  tokens per sequence, one untimed step, then --steps timed steps, each feeding
                  the last output back in; the step time is the median (not checked against
                  the dense model: numesh run checks the same model)
Bytes of a step: the weights each device holds plus the valid part of its KV caches, summed
over the devices (ShardedTransformer::decode_bytes_per_device, as numesh run counts them);
GB/s = 1e9 of those bytes per second of the median step; "of read" = GB/s / read bandwidth.
With MoE blocks (--moe-every) every local expert is counted, more than top-k routing reads.
Model: --heads 0 means hidden / head_dim, --kv-heads 0 a quarter of the heads (all when 4
does not divide them), --ffn 0 four times hidden, --moe-ffn 0 ffn / top-k. --sweep-hidden runs
each size with those rules (ffn = 4 x hidden).
Columns: hidden, ffn, layers, heads (query/kv), parameters, weight dtype (norms and the KV
cache stay f32), MB read per step, median step ms, tokens/s (batch / step), GB/s, of read, and
x f32: tokens/s over the same size's f32 row of this run.

Examples:
  numesh bench decode
  numesh bench decode --dtypes f32,bf16
  numesh bench decode --sweep-hidden 256,512,1024,2048 --json decode.json
  numesh bench decode --hidden 2048 --layers 2 --batch 4 --steps 32
  scripts/plot_benchmarks.py decode.json --out plots)");
  add_mesh_options(*cmd, o.mesh, /*with_threads=*/true);
  cmd->add_option("--batch", o.batch, "Sequences")->capture_default_str();
  cmd->add_option("--prompt", o.prompt, "Prompt tokens per sequence before the steps")
      ->capture_default_str();
  cmd->add_option("--steps", o.steps, "Timed decode steps (median)")->capture_default_str();
  auto* hidden = cmd->add_option("--hidden", o.hidden, "Hidden size H")->capture_default_str();
  cmd->add_option("--layers", o.layers, "Blocks")->capture_default_str();
  cmd->add_option("--heads", o.heads, "Query heads (0: hidden / head-dim)")->capture_default_str();
  cmd->add_option("--kv-heads", o.kv_heads, "Key/value heads (0: a quarter of the heads)")
      ->capture_default_str();
  cmd->add_option("--head-dim", o.head_dim, "Per-head dim (even: RoPE)")->capture_default_str();
  auto* ffn =
      cmd->add_option("--ffn", o.ffn, "Intermediate size of the SwiGLU MLPs (0: 4 x hidden)")
          ->capture_default_str();
  cmd->add_option("--moe-every", o.moe_every, "Every n-th block is MoE (0: none, a dense model)")
      ->capture_default_str();
  cmd->add_option("--experts", o.experts, "Experts per MoE layer")->capture_default_str();
  cmd->add_option("--top-k", o.top_k, "Experts per token")->capture_default_str();
  cmd->add_option("--moe-ffn", o.moe_ffn, "Intermediate size of each expert (0: ffn / top-k)")
      ->capture_default_str();
  cmd->add_option("--sweep-hidden", o.sweep_hidden,
                  "Run several model sizes: hidden sizes, comma-separated (ffn = 4 x hidden)")
      ->excludes(hidden)
      ->excludes(ffn);
  cmd->add_option("--size", o.size,
                  "Bytes each device reads for the read bandwidth (a multiple of 64)")
      ->capture_default_str();
  cmd->add_option("--repeats", o.repeats, "Timed passes of the read bandwidth (median)")
      ->capture_default_str();
  cmd->add_option("--dtypes", o.dtypes,
                  "Weight storage dtypes, comma-separated (f32, bf16, f16, q8_0, q4_0): each size "
                  "runs once per dtype, in this order; rows after an f32 row give their tokens/s "
                  "over it (x f32)")
      ->capture_default_str();
  add_kv_layout_option(*cmd, o.kv_layout);
  add_kv_dtype_option(*cmd, o.kv_dtype);
  cmd->add_option("--seed", o.seed, "Seed of the weights and inputs")->capture_default_str();
  cmd->add_option("--json", o.json, "Write the results and the machine as JSON to FILE");
  cmd->add_flag("--quiet", o.quiet, "No progress line on stderr");
  return cmd;
}

void run_bench_decode(const BenchDecodeOptions& o, std::ostream& out) {
  // Everything the options decide is checked before a device exists.
  const CheckedDecodeOptions c = check_decode_options(o);
  std::ofstream json_file = open_json_file(o.json);

  const runtime::DeviceMesh mesh = make_mesh(o.mesh);
  check_device_nodes_fit(mesh.devices(), "--size", c.bytes, 1, "the read bandwidth needs 1 array");
  const std::vector<ops::ModelAxes> axes = decode_axes(c.configs, o.batch);
  report_decode_setup(o, c.kv_dtype, mesh, out);

  const ProgressLine progress(o.quiet);
  const DecodeReadBandwidth read =
      measure_decode_read_bandwidth(mesh.devices(), c.bytes, o.repeats, progress);
  const std::vector<std::string> notes = decode_notes(read, c.configs.front());
  report_decode_read_bandwidth(read, c.bytes, o.repeats, notes, out);
  const nlohmann::json models = measure_decode_rows(o, c, mesh, axes, read.gbps, progress, out);
  if (json_file.is_open()) write_decode_json(json_file, o, mesh, c.bytes, read, models, notes);
}

}  // namespace numesh::tools
