#include "generate_command.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "baselines.hpp"
#include "bench_common.hpp"
#include "kv_dtype_option.hpp"
#include "mmap_option.hpp"
#include "nonfinite_note.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/progress_line.hpp"
#include "numesh/core/timing.hpp"
#include "numesh/models/engine/engine.hpp"
#include "numesh/models/engine/model_source.hpp"
#include "numesh/models/formats/gguf.hpp"
#include "numesh/models/formats/npy.hpp"
#include "numesh/models/hf/hf_config.hpp"
#include "numesh/models/hf/random_model.hpp"
#include "numesh/models/lm/causal_lm.hpp"
#include "numesh/models/lm/generation.hpp"
#include "numesh/models/tokenizers/text_tokenizer.hpp"
#include "numesh/ops/lowering/lm_head.hpp"
#include "numesh/ops/lowering/program.hpp"
#include "numesh/ops/lowering/transformer.hpp"
#include "numesh/runtime/graph.hpp"
#include "numesh/sharding/partition_manager.hpp"
#include "parsers.hpp"
#include "paxis_options.hpp"
#include "ranks.hpp"

namespace numesh::tools {

namespace {

using Clock = std::chrono::steady_clock;

void progress(bool quiet, const std::string& text) {
  if (quiet) return;
  std::fprintf(stderr, "%s\n", text.c_str());
  std::fflush(stderr);
}

// What run_generate's options say, checked before anything is written, loaded or created.
struct CheckedOptions {
  DType dtype = DType::kF32;
  models::WeightMapping mapping = models::WeightMapping::kAuto;  // --mmap
  DType kv_dtype = DType::kF32;                                  // --kv-dtype
  bool sampling = false;
  ops::SamplingOptions sampling_options;
  std::vector<std::string> texts;                    // prompts given as text, in order
  std::vector<std::vector<std::int32_t>> prompts;    // prompts given as ids (--ids)
  sharding::ModeArg mode = sharding::Mode::kDecode;  // --mode (set by check_options)
  std::optional<sharding::PartitionManager> partition_manager;
  // Opened now, so that a path that cannot be written is refused before the model loads (and
  // the generation is not lost at the end).
  std::ofstream json_file;
  std::ofstream logits_file;
  std::ofstream trace_file;
};

CheckedOptions check_options(const GenerateOptions& o) {
  CheckedOptions c;
  if (!o.dtype.empty()) c.dtype = parse_dtype(o.dtype);
  c.mapping = models::parse_weight_mapping(o.mmap);
  c.kv_dtype = models::parse_kv_dtype(o.kv_dtype);
  NUMESH_CHECK(o.model.empty() || o.random_model.empty(), ValueError,
               "--model and --random-model exclude each other: generate from a checkpoint, or "
               "write a random one");
  NUMESH_CHECK(o.max_new_tokens >= 1 && o.max_new_tokens <= (std::int64_t{1} << 30), ValueError,
               "--max-new-tokens {} must be between 1 and 2^30", o.max_new_tokens);
  NUMESH_CHECK(o.prefill_chunk >= 1, ValueError, "--prefill-chunk {} must be at least 1",
               o.prefill_chunk);
  NUMESH_CHECK(o.trace.empty() || o.max_new_tokens >= 2, ValueError,
               "--trace times the decode steps, and --max-new-tokens {} takes none (the first new "
               "token comes from the prompt's pass): ask for 2 or more",
               o.max_new_tokens);
  c.sampling = o.temperature != 0.0;
  NUMESH_CHECK(
      !(c.sampling && o.greedy), ValueError,
      "--greedy and --temperature {} exclude each other: pick the most likely token, or sample",
      o.temperature);
  c.sampling_options = {.temperature = o.temperature, .top_k = o.top_k, .top_p = o.top_p};
  if (c.sampling) ops::validate(c.sampling_options);
  const int kinds =
      (o.prompt.empty() ? 0 : 1) + (o.ids.empty() ? 0 : 1) + (o.prompt_file.empty() ? 0 : 1);
  NUMESH_CHECK(kinds == 1, ValueError,
               "give the prompts as text with --prompt or --prompt-file (the model's tokenizer "
               "encodes them) or as "
               "token ids with --ids, one of the three");
  // Prompts given as text: --prompt's, or --prompt-file's non-empty lines (read now, so that a
  // missing file is refused before the model loads).
  c.texts = o.prompt;
  if (!o.prompt_file.empty()) {
    std::ifstream file(o.prompt_file);
    NUMESH_CHECK(file.is_open(), IoError, "cannot read --prompt-file '{}'", o.prompt_file);
    for (std::string line; std::getline(file, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") != std::string::npos) c.texts.push_back(line);
    }
    NUMESH_CHECK(!c.texts.empty(), ValueError,
                 "--prompt-file '{}' holds no prompt (no non-empty line)", o.prompt_file);
  }
  for (const std::string& ids : o.ids) c.prompts.push_back(parse_token_ids(ids, "--ids"));
  const std::size_t sequences = std::max(c.prompts.size(), c.texts.size());
  NUMESH_CHECK(o.logits_out.empty() || sequences == 1, ValueError,
               "--logits-out writes one prompt's logits [P + N - 1, V], but {} prompts were given",
               sequences);
  check_mesh_options(o.mesh);
  c.mode = parse_run_mode(o.mode);
  c.partition_manager.emplace(build_paxis(o.paxis_json, o.sets));
  // Under mpirun the ranks generate alike and rank 0 alone writes; --baselines time one
  // process's reads and sgemm beside the load, which the other ranks' loads would disturb.
  const bool writer = command_world()->rank() == 0;
  NUMESH_CHECK(!o.baselines || command_world()->size() == 1, ValueError,
               "--baselines measures one process; run it without mpirun (or with -np 1)");
  if (!writer) return c;
  c.json_file = open_json_file(o.json);
  if (!o.logits_out.empty()) {
    c.logits_file.open(o.logits_out, std::ios::binary);
    NUMESH_CHECK(c.logits_file.is_open(), IoError, "cannot write --logits-out file '{}'",
                 o.logits_out);
  }
  if (!o.trace.empty()) {
    c.trace_file.open(o.trace);
    NUMESH_CHECK(c.trace_file.is_open(), IoError, "cannot write --trace file '{}'", o.trace);
  }
  return c;
}

// A folder removed when this goes (empty: nothing to remove).
struct RemovedAtExit {
  std::filesystem::path path;
  RemovedAtExit() = default;
  RemovedAtExit(const RemovedAtExit&) = delete;
  RemovedAtExit& operator=(const RemovedAtExit&) = delete;
  ~RemovedAtExit() {
    std::error_code ignored;
    if (!path.empty()) std::filesystem::remove_all(path, ignored);
  }
};

// The model's folder: --model, or a random Llama written to --random-model or, without it, to a
// folder of this process's own that `temporary` removes at the end (a shared one would be
// rewritten under another run's mapping).
std::filesystem::path model_folder(const GenerateOptions& o, DType dtype,
                                   RemovedAtExit& temporary) {
  if (!o.model.empty()) return o.model;
  if (o.random_model.empty()) {
    temporary.path =
        std::filesystem::temp_directory_path() / fmt::format("numesh-random-model-{}", ::getpid());
  }
  const std::filesystem::path dir =
      !o.random_model.empty() ? std::filesystem::path(o.random_model) : temporary.path;
  NUMESH_CHECK(!std::filesystem::exists(dir / "model.safetensors.index.json"), ValueError,
               "--random-model {}: the folder holds a sharded checkpoint "
               "(model.safetensors.index.json), which the "
               "random model's files would not replace; give an empty or new folder",
               dir.string());
  NUMESH_CHECK(
      o.random_hidden > 0 && o.random_hidden % 64 == 0 && o.random_layers >= 1, ValueError,
      "--random-hidden {} must be a positive multiple of 64 and --random-layers {} positive",
      o.random_hidden, o.random_layers);
  progress(o.quiet, fmt::format("writing a random Llama (hidden {}, {} layers) to {} ...",
                                o.random_hidden, o.random_layers, dir.string()));
  // A block format is quantized at load: the checkpoint holds the values in f32 (safetensors has
  // no block formats).
  const auto write = [&] {
    models::write_random_model(dir, models::small_llama_config(o.random_hidden, o.random_layers),
                               is_element_dtype(dtype) ? dtype : DType::kF32, 1234);
  };
  runtime::Transport& world = *command_world();
  if (world.size() == 1 || o.random_model.empty()) {
    write();  // under mpirun, each rank into a folder of its own
  } else {
    // One folder for every rank: rank 0 writes it while the others wait.
    on_every_rank(world, [&] {
      if (world.rank() == 0) write();
    });
  }
  return dir;
}

// The prompts as ids, checked against the model: the text ones encoded by the folder's
// tokenizer, every id inside the vocabulary, and the longest prompt plus --max-new-tokens
// within the model's context.
struct Prompts {
  std::vector<std::vector<std::int32_t>> ids;
  std::int64_t longest = 0;
  std::int64_t max_len = 0;  // longest + --max-new-tokens
};

Prompts encode_prompts(const GenerateOptions& o, const CheckedOptions& c,
                       const models::ModelSource& model) {
  const models::HfConfig& config = model.config();
  Prompts p;
  p.ids = c.prompts;
  const char* source = !o.ids.empty() ? "--ids" : !o.prompt.empty() ? "--prompt" : "--prompt-file";
  if (!c.texts.empty()) {
    NUMESH_CHECK(
        model.tokenizer() != nullptr, IoError,
        "{}: {} has no tokenizer.json or tokenizer.model to encode it; give the prompt's token ids "
        "with --ids",
        source, model.path().string());
    for (const std::string& text : c.texts) {
      p.ids.push_back(model.tokenizer()->encode(text, /*add_special_tokens=*/true));
      NUMESH_CHECK(!p.ids.back().empty(), ValueError, "{} '{}' encodes to no token", source, text);
    }
  }
  for (std::size_t b = 0; b < p.ids.size(); ++b) {
    const std::vector<std::int32_t>& prompt = p.ids[b];
    const std::string which = p.ids.size() > 1 ? fmt::format(" of prompt {}", b) : std::string();
    for (std::size_t i = 0; i < prompt.size(); ++i) {
      const bool inside = prompt[i] < config.vocab_size;
      NUMESH_CHECK(inside, IndexError,
                   "{}: token {} at position {}{} is outside the model's vocabulary [0, {})",
                   source, prompt[i], i, which, config.vocab_size);
    }
    p.longest = std::max(p.longest, static_cast<std::int64_t>(prompt.size()));
  }
  p.max_len = p.longest + o.max_new_tokens;
  NUMESH_CHECK(
      p.max_len <= config.max_context(), ValueError,
      "{} prompt tokens and --max-new-tokens {} make a context of {}, longer than the model's {}",
      p.longest, o.max_new_tokens, p.max_len, config.max_context());
  return p;
}

// The model on the mesh, and (--baselines) plain reads of its files.
struct LoadedModel {
  std::optional<models::Engine> engine;
  double read_seconds = 0.0;        // --baselines: a plain read of the same files, else 0
  double new_memory_seconds = 0.0;  // --baselines: a read of them into new memory, else 0
  std::vector<models::NonfiniteWeight> nonfinite;  // the weights holding NaN or infinities
  double scan_seconds = 0.0;                       // the scan that found them
};

LoadedModel load_model(const GenerateOptions& o, const CheckedOptions& c,
                       models::ModelSource source, std::int64_t batch, std::int64_t max_len) {
  LoadedModel m;
  // --baselines: a plain read of the files before the load (so both find them in the page
  // cache when they fit) and after it (the figure reported).
  const std::vector<std::filesystem::path> files =
      o.baselines ? source.weight_files() : std::vector<std::filesystem::path>{};
  if (o.baselines) (void)plain_read_seconds(files);
  runtime::DeviceMesh mesh = make_mesh(o.mesh);
  {
    const ProgressLine line(o.quiet);
    m.engine.emplace(models::Engine::load(
        std::move(source), std::move(mesh),
        // Unset: a GGUF model's matrices as the file stores each (EngineOptions::dtype).
        {.dtype = o.dtype.empty() ? std::nullopt : std::optional<DType>(c.dtype),
         .sequences = batch,
         .context = max_len,
         .partitions = *c.partition_manager,
         .mode = c.mode,
         .progress = [&](std::int64_t done,
                         std::int64_t total) { line.update(load_progress_text(done, total)); },
         .mapping = c.mapping,
         .kv_dtype = c.kv_dtype,
         .prefill_chunk = o.prefill_chunk}));
  }
  // Timed: where shards are read in place, the scan is the first reader of the file's pages,
  // and maps them (the page-table work a copy does within the load).
  const auto scan_start = std::chrono::steady_clock::now();
  m.nonfinite = models::find_nonfinite_weights(m.engine->model().weights());
  m.scan_seconds = seconds_since(scan_start);
  m.read_seconds = o.baselines ? plain_read_seconds(files) : 0.0;
  m.new_memory_seconds = o.baselines ? read_into_new_memory_seconds(files) : 0.0;
  return m;
}

// Prints the model, its axes and the load's rate (with --baselines, a plain read's too), and
// notes the weights holding NaN or infinities (refused with --refuse-nonfinite).
void report_load(const GenerateOptions& o, const CheckedOptions& c, const LoadedModel& m,
                 std::ostream& out) {
  const models::Engine& e = *m.engine;
  const models::HfConfig& config = e.config();
  const double bytes = static_cast<double>(e.checkpoint_bytes());
  out << fmt::format(
      "numesh generate: {} ({} model, {} layers, hidden {}, vocabulary {}), {} weights, {} KV "
      "cache, mesh {}\n",
      e.source().path().string(), to_string(config.architecture), config.num_hidden_layers,
      config.hidden_size, config.vocab_size, e.formats(), to_string(c.kv_dtype),
      e.mesh().mesh().repr());
  out << fmt::format("axes ({}): {}\n", o.mode, model_axes_text(e.axes()));
  const double mapped = static_cast<double>(e.model().mapped_bytes());
  out << fmt::format("load     {:.1f} MB in {:.3f} s ({:.2f} GB/s: {})\n", bytes / 1e6,
                     e.load_seconds(), bytes / e.load_seconds() / 1e9,
                     mapped <= 0
                         ? std::string("each device read its shards, converted and laid out")
                         : fmt::format("{:.1f} MB of shards read in place from the file's pages "
                                       "(--mmap), the rest by each device",
                                       mapped / 1e6));
  // The copies into panels that --mmap on would have read in place: what they buy, and how to
  // trade them for a quicker load (docs/benchmarks.md, "Session 67" and "Session 69").
  if (const double panelled = static_cast<double>(e.model().panel_copied_bytes()); panelled > 0) {
    out << fmt::format(
        "         {:.1f} MB of it copied into panels of 16 outputs (the faster order of q8_0's "
        "and q4_0's products of several rows, and of q4_0's of one); --mmap on reads the "
        "file's rows in place instead: a quicker load, slower products\n",
        panelled / 1e6);
  }
  if (o.baselines) {
    out << fmt::format(
        "         a plain read of the same files: {:.3f} s ({:.2f} GB/s); the load takes {:.2f}x "
        "its time\n",
        m.read_seconds, bytes / m.read_seconds / 1e9, e.load_seconds() / m.read_seconds);
    out << fmt::format(
        "         a read of them into new memory (the kernel zeroes each new page): {:.3f} s "
        "({:.2f} GB/s); the load takes {:.2f}x its time\n",
        m.new_memory_seconds, bytes / m.new_memory_seconds / 1e9,
        e.load_seconds() / m.new_memory_seconds);
    out << fmt::format(
        "         then the scan of the weights for NaN and infinities: {:.3f} s (of shards read "
        "in place, the first touch of the file's pages)\n",
        m.scan_seconds);
  }
  note_nonfinite_weights(m.nonfinite, o.refuse_nonfinite, e.source().path().string(), out);
}

const char* stopped_text(models::StopReason r) {
  return r == models::StopReason::kStopId ? "end-of-sequence id" : "--max-new-tokens";
}

// What the generation gave, and its text where the folder has a tokenizer.
struct Generated {
  models::GenerationResult result;
  std::vector<std::string> texts;  // each sequence's generated text (empty without a tokenizer)
};

// Generates and prints each sequence: one prompt's ids streamed as they come; several printed
// when all have stopped. With a tokenizer the text follows the ids, decoded at the end (a token
// can end inside a character, so decoding token by token would print broken characters). A
// model's vocabulary can be larger than its tokenizer's (padded embeddings; a random model
// beside a small tokenizer): ids the tokenizer lacks are left out of the text, and counted.
Generated generate_and_print(const GenerateOptions& o, const CheckedOptions& c, models::Engine& e,
                             const Prompts& p, std::mt19937_64& rng, std::ostream& out) {
  const models::TextTokenizer* tokenizer = e.source().tokenizer();
  std::int64_t unknown_ids = 0;
  const auto text_of = [&](const auto& ids) {
    std::vector<std::int32_t> known;
    for (const auto id : ids) {
      if (tokenizer->knows(static_cast<std::int32_t>(id))) {
        known.push_back(static_cast<std::int32_t>(id));
      } else {
        ++unknown_ids;
      }
    }
    return tokenizer->decode(known, /*skip_special_tokens=*/true);
  };
  const models::GenerationOptions options{
      .max_new_tokens = o.max_new_tokens,
      .stop_ids = o.ignore_eos ? std::vector<std::int64_t>{} : e.config().eos_token_ids,
      .sampling = c.sampling ? std::optional(c.sampling_options) : std::nullopt,
      .keep_logits = !o.logits_out.empty()};
  const bool streamed = p.ids.size() == 1;
  if (streamed) {
    out << fmt::format("prompt   {}\n", fmt::join(p.ids.front(), " "));
    out << "ids     ";
    out.flush();
  } else {
    progress(o.quiet,
             fmt::format(
                 "generating {} sequences (prompts of {} to {} tokens) ...", p.ids.size(),
                 std::min_element(p.ids.begin(), p.ids.end(),
                                  [](const auto& a, const auto& b) { return a.size() < b.size(); })
                     ->size(),
                 p.longest));
  }
  Generated g;
  g.result = models::generate(e.model(), p.ids, options, rng,
                              [&](std::int64_t, std::span<const std::int64_t> tokens) {
                                if (!streamed || tokens.front() < 0) return;
                                out << " " << tokens.front();
                                out.flush();
                              });
  const models::GenerationResult& result = g.result;
  g.texts.resize(p.ids.size());
  for (std::size_t b = 0; b < p.ids.size(); ++b) {
    if (tokenizer) g.texts[b] = text_of(result.ids[b]);
    if (streamed) {
      out << fmt::format("\nstopped  at {} ({} tokens)\n", stopped_text(result.stopped[b]),
                         result.ids[b].size());
    } else {
      out << fmt::format("sequence {}\nprompt   {}\nids      {}\nstopped  at {} ({} tokens)\n", b,
                         fmt::join(p.ids[b], " "), fmt::join(result.ids[b], " "),
                         stopped_text(result.stopped[b]), result.ids[b].size());
    }
    if (tokenizer) {
      const std::string prompt_text = !c.texts.empty() ? c.texts[b] : text_of(p.ids[b]);
      out << fmt::format("text     {}{}\n", prompt_text, g.texts[b]);
    }
  }
  if (tokenizer && unknown_ids > 0) {
    out << fmt::format(
        "         ({} ids are outside the tokenizer's vocabulary of {} and left out of the text)\n",
        unknown_ids, tokenizer->vocab_size());
  }
  return g;
}

// --baselines: the prefill's FLOPs against OpenBLAS's sgemm at its rows and the model's widest
// projection, and the decode's bytes per step against the memory read bandwidth.
struct BaselineReport {
  nlohmann::json json = nullptr;
  std::string prefill_note, decode_note;  // printed under the prefill and decode lines
};

BaselineReport measure_baselines(const GenerateOptions& o, const Prompts& p, const LoadedModel& m,
                                 const models::GenerationResult& result) {
  BaselineReport r;
  if (!o.baselines) return r;
  const models::Engine& e = *m.engine;
  const models::HfConfig& config = e.config();
  const runtime::DeviceMesh& mesh = e.mesh();
  const double bytes = static_cast<double>(e.checkpoint_bytes());
  const auto batch = static_cast<std::int64_t>(p.ids.size());
  const ops::TransformerConfig t = config.transformer_config();
  const double prefill_flops =
      t.flops(batch, p.longest, 0) +
      2.0 * static_cast<double>(batch * config.hidden_size * config.vocab_size);
  const std::int64_t widest = std::max({t.ffn, t.moe_ffn, config.hidden_size});
  const int threads = static_cast<int>(mesh.device_set()->total_threads());
  progress(o.quiet, "baselines: OpenBLAS sgemm and the memory read bandwidth ...");
  // The rows one run of the prefill takes (a long prompt runs in chunks).
  const std::int64_t rows = batch * e.model().run_tokens(p.longest);
  const double sgemm = openblas_sgemm_gflops(rows, config.hidden_size, widest, threads, 5);
  const double prefill_gflops = prefill_flops / result.prefill_seconds / 1e9;
  r.prefill_note = fmt::format(
      "         {:.1f} GFLOP/s; OpenBLAS sgemm [{}, {}] x [{}, {}] on {} threads: {:.1f} GFLOP/s "
      "(the prefill at {:.2f} of it)\n",
      prefill_gflops, rows, config.hidden_size, config.hidden_size, widest, threads, sgemm,
      prefill_gflops / sgemm);
  r.json = {{"plain_read_seconds", m.read_seconds},
            {"plain_read_gbps", bytes / m.read_seconds / 1e9},
            {"load_fraction_of_plain_read", m.read_seconds / e.load_seconds()},
            {"read_into_new_memory_seconds", m.new_memory_seconds},
            {"load_fraction_of_read_into_new_memory", m.new_memory_seconds / e.load_seconds()},
            {"prefill_gflops", prefill_gflops},
            {"sgemm_gflops", sgemm},
            {"sgemm_shape", {rows, config.hidden_size, widest}},
            {"prefill_fraction_of_sgemm", prefill_gflops / sgemm}};
  if (result.decode_steps > 0) {
    const double read = read_bandwidth_gbps(mesh, std::int64_t{256} << 20, 5);
    // The weights and caches a step reads, at the middle of the decode.
    const double step_bytes =
        static_cast<double>(e.model().decode_bytes(p.longest + result.decode_steps / 2));
    const double step_gbps =
        step_bytes * static_cast<double>(result.decode_steps) / result.decode_seconds / 1e9;
    // A mixture of formats (a GGUF Q4_K_M file loaded as stored) has no one size a weight.
    const bool one_format = e.formats() == to_string(e.dtype());
    const std::string weights = one_format ? fmt::format("{} weights, {:.4g} bytes a weight",
                                                         e.formats(), bytes_per_weight(e.dtype()))
                                           : fmt::format("{} weights", e.formats());
    r.decode_note = fmt::format(
        "         {:.1f} MB a step ({}) at {:.2f} GB/s; the memory read bandwidth: {:.2f} GB/s "
        "(the decode at {:.2f} of it)\n",
        step_bytes / 1e6, weights, step_gbps, read, step_gbps / read);
    r.json["bytes_per_weight"] =
        one_format ? nlohmann::json(bytes_per_weight(e.dtype())) : nlohmann::json(nullptr);
    r.json["decode_bytes_per_step"] = step_bytes;
    r.json["decode_gbps"] = step_gbps;
    r.json["read_gbps"] = read;
    r.json["decode_fraction_of_read"] = step_gbps / read;
  }
  return r;
}

// The prompts' tokens (a batch's prefill computes every padded position; the rate counts the
// real tokens).
std::int64_t prompt_tokens(const Prompts& p) {
  std::int64_t n = 0;
  for (const auto& prompt : p.ids) n += static_cast<std::int64_t>(prompt.size());
  return n;
}

// Prints the prefill and decode rates (and the baselines' notes).
void report_rates(const Prompts& p, const models::GenerationResult& result,
                  const BaselineReport& baselines, std::ostream& out) {
  out << fmt::format("prefill  {} tokens in {:.2f} ms ({:.0f} tokens/s)\n", prompt_tokens(p),
                     result.prefill_seconds * 1e3,
                     static_cast<double>(prompt_tokens(p)) / result.prefill_seconds);
  out << baselines.prefill_note;
  if (result.decode_steps > 0) {
    out << fmt::format("decode   {} tokens in {} steps, {:.2f} ms per step ({:.1f} tokens/s)\n",
                       result.decoded_tokens, result.decode_steps,
                       result.decode_seconds * 1e3 / static_cast<double>(result.decode_steps),
                       static_cast<double>(result.decoded_tokens) / result.decode_seconds);
  }
  out << baselines.decode_note;
}

// --json: the run as one JSON document (one prompt: its fields at the top level too).
void write_json(const GenerateOptions& o, CheckedOptions& c, const Prompts& p, const LoadedModel& m,
                const Generated& g, const BaselineReport& baselines) {
  const models::Engine& e = *m.engine;
  const models::GenerationResult& result = g.result;
  nlohmann::json seqs = nlohmann::json::array();
  for (std::size_t b = 0; b < p.ids.size(); ++b) {
    seqs.push_back({{"prompt_ids", p.ids[b]},
                    {"ids", result.ids[b]},
                    {"text", e.source().tokenizer() != nullptr ? nlohmann::json(g.texts[b])
                                                               : nlohmann::json(nullptr)},
                    {"stopped", stopped_text(result.stopped[b])}});
  }
  nlohmann::json j{
      {"model", e.source().path().string()},
      {"architecture", std::string(to_string(e.config().architecture))},
      {"dtype", e.formats()},
      {"kv_dtype", std::string(to_string(c.kv_dtype))},
      {"mesh", e.mesh().mesh().repr()},
      {"sequences", seqs},
      {"sampling", c.sampling ? nlohmann::json{{"temperature", o.temperature},
                                               {"top_k", o.top_k},
                                               {"top_p", o.top_p},
                                               {"seed", o.seed}}
                              : nlohmann::json("greedy")},
      {"load_seconds", e.load_seconds()},
      {"load_bytes", e.checkpoint_bytes()},
      {"load_mapped_bytes", e.model().mapped_bytes()},
      {"load_panel_copied_bytes", e.model().panel_copied_bytes()},
      {"nonfinite_scan_seconds", m.scan_seconds},
      {"baselines", baselines.json},
      {"prefill_tokens", prompt_tokens(p)},
      {"prefill_seconds", result.prefill_seconds},
      {"prefill_tokens_per_second", static_cast<double>(prompt_tokens(p)) / result.prefill_seconds},
      {"decode_steps", result.decode_steps},
      {"decode_tokens", result.decoded_tokens},
      {"decode_seconds", result.decode_seconds},
      {"decode_tokens_per_second",
       result.decoded_tokens > 0
           ? static_cast<double>(result.decoded_tokens) / result.decode_seconds
           : 0.0}};
  if (p.ids.size() == 1) {
    j["prompt_ids"] = seqs[0]["prompt_ids"];
    j["ids"] = seqs[0]["ids"];
    j["text"] = seqs[0]["text"];
    j["stopped"] = seqs[0]["stopped"];
  }
  c.json_file << j.dump(2) << "\n";
}

}  // namespace

CLI::App* add_generate_command(CLI::App& app, GenerateOptions& o) {
  CLI::App* cmd = app.add_subcommand("generate",
                                     "Generate tokens from a Hugging Face checkpoint (config.json "
                                     "+ safetensors) or a GGUF file on the machine's mesh: greedy "
                                     "or sampled decoding of a prompt (text or token ids), the ids "
                                     "streamed as they come, with load, prefill "
                                     "and decode rates.");
  cmd->footer(fmt::format(
      R"(Models: llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, gemma and phi3 checkpoints (F32, BF16 or F16
safetensors, one file or shards with model.safetensors.index.json), or GGUF files of them (llama,
qwen2, qwen3, qwen2moe, qwen3moe, gemma, phi3 in {};
tokenizer and chat template from the metadata).
Without --model, a small random Llama is written in
Hugging Face layout (to --random-model DIR, or a temporary folder) and loaded back through the
same path. --prompt needs the folder's tokenizer: tokenizer.json (byte-level BPE: Llama 3,
Qwen2/3) or tokenizer.model (SentencePiece: Llama 2, Mistral); the random model has none, so it
takes --ids.
Examples:
  numesh generate --ids 1,450,4996 --max-new-tokens 16
  numesh generate --model ~/models/Llama-3.2-1B --prompt "The capital of France is" --dtype bf16
  numesh generate --model DIR --ids 1,2,3 --dims 1,1,2 --logits-out logits.npy
  numesh generate --model DIR --prompt "Once upon a time" --temperature 0.8 --top-k 40 --top-p 0.95 --seed 7
  numesh generate --model DIR --prompt-file prompts.txt --max-new-tokens 64 --json out.json
Several prompts (--prompt-file, or --prompt or --ids given more than once) run as one batch:
one prefill of all of them, the shorter padded at their end, then decode steps of one token per
sequence, each at its own position and stopping on its own; their ids and text are printed when
all have stopped.)",
      models::gguf_types_numesh_reads()));
  add_mesh_options(*cmd, o.mesh, /*with_threads=*/true);
  cmd->add_option("--mode", o.mode,
                  "The mode eformer's semantic axes resolve in for the layout: train, prefill, "
                  "decode or dim:N (the "
                  "model prefills and decodes with one layout)")
      ->capture_default_str();
  cmd->add_option("--paxis-json", o.paxis_json,
                  "JSON file with PartitionAxis fields (eformer's defaults otherwise)");
  cmd->add_option("--set", o.sets, "field=value for one PartitionAxis field, repeatable");
  cmd->add_option("--model", o.model,
                  "Folder of a Hugging Face checkpoint (config.json, *.safetensors), or a GGUF "
                  "file");
  cmd->add_option("--random-model", o.random_model,
                  "Write a random Llama in Hugging Face layout to DIR and generate from it (the "
                  "default without "
                  "--model, in a temporary folder)");
  cmd->add_option("--random-hidden", o.random_hidden,
                  "The random model's hidden size (a multiple of 64)")
      ->capture_default_str();
  cmd->add_option("--random-layers", o.random_layers, "The random model's layers")
      ->capture_default_str();
  cmd->add_option("--ids", o.ids,
                  "The prompt's token ids, comma-separated; give --ids again for more prompts, "
                  "decoded together")
      ->take_all()
      ->expected(1);
  cmd->add_option("--prompt", o.prompt,
                  "The prompt as text, encoded by the model's tokenizer.json or tokenizer.model "
                  "(with BOS); give "
                  "--prompt again for more prompts")
      ->take_all()
      ->expected(1);
  cmd->add_option("--prompt-file", o.prompt_file,
                  "Prompts as text, one per non-empty line, decoded together as one batch of "
                  "different lengths");
  cmd->add_option("--max-new-tokens", o.max_new_tokens, "Tokens to generate at most")
      ->capture_default_str();
  cmd->add_flag("--ignore-eos", o.ignore_eos, "Do not stop at the model's end-of-sequence ids");
  cmd->add_flag("--greedy", o.greedy, "Pick the most likely token (the default)");
  cmd->add_option(
      "--temperature", o.temperature,
      "Sample instead, from the logits divided by T > 0 (then --top-k, --top-p, --seed)");
  cmd->add_option("--top-k", o.top_k,
                  "Sampling: keep the K most likely tokens (only they leave the devices)")
      ->capture_default_str();
  cmd->add_option("--top-p", o.top_p, "Sampling: then the most likely whose probabilities sum to P")
      ->capture_default_str();
  cmd->add_option("--seed", o.seed,
                  "Sampling: the generator's seed (the same seed gives the same tokens)")
      ->capture_default_str();
  cmd->add_option("--dtype", o.dtype,
                  fmt::format("How the devices store the matrices: {} (GGML's block formats "
                              "quantized at load; norms and routers stay f32). Default: a GGUF "
                              "file's matrices each in the format the file stores it in (a "
                              "Q4_K_M file's Q4_K and Q6_K), f32 otherwise",
                              dtype_choices()));
  add_mmap_option(*cmd, o.mmap);
  add_kv_dtype_option(*cmd, o.kv_dtype);
  cmd->add_option("--prefill-chunk", o.prefill_chunk,
                  "Prefill a longer prompt in chunks of at most N tokens (llama.cpp's micro-batch "
                  "default): a run's intermediates grow with its tokens")
      ->capture_default_str();
  cmd->add_option("--logits-out", o.logits_out,
                  "Write the logits as float32 .npy [P + N - 1, V]: every prompt position, then "
                  "each decode step "
                  "(one prompt)");
  cmd->add_option("--json", o.json, "Write the prompt, the ids and the timings as JSON to FILE");
  cmd->add_option(
      "--trace", o.trace,
      "Write the last decode step's layers, node by node (norms, products, attention, "
      "collectives; each device a process, each of its threads a track), as Chrome trace JSON "
      "to FILE (chrome://tracing, Perfetto). Every decode step is then timed, two clock reads a "
      "node; the embedding and the LM head run as programs of their own, not in it. Under "
      "mpirun, rank 0's devices");
  cmd->add_flag(
      "--baselines", o.baselines,
      "Also measure, in this run, a plain read of the checkpoint's files (into an 8 MiB buffer, "
      "and into new memory of their size), OpenBLAS's sgemm at the prefill's rows and the memory "
      "read bandwidth, and print the load, prefill and decode against them");
  cmd->add_flag(
      "--refuse-nonfinite", o.refuse_nonfinite,
      "Refuse a checkpoint whose weights hold NaN or infinities (without it, a note names them)");
  cmd->add_flag("--quiet", o.quiet, "No progress on stderr");
  return cmd;
}

// --trace: the decode program's last run as Chrome trace JSON, or, when no decode step ran (every
// sequence stopped at its first token), an empty trace and a line that says so.
void write_trace(const GenerateOptions& o, CheckedOptions& c, runtime::CompiledGraph& graph,
                 const models::GenerationResult& result, std::ostream& out) {
  graph.set_timing(false);
  // Without a decode step the program's last run, if any, was a one-token prompt's.
  const bool stepped = result.decode_steps > 0;
  c.trace_file << (stepped ? graph.chrome_trace() : std::string(R"({"traceEvents": []})")) << "\n";
  c.trace_file.close();
  NUMESH_CHECK(c.trace_file.good(), IoError, "cannot write --trace file '{}'", o.trace);
  if (stepped) {
    out << fmt::format("trace    {} (the last of {} decode steps, {} nodes)\n", o.trace,
                       result.decode_steps, graph.size());
  } else {
    out << fmt::format(
        "trace    {}: empty, no decode step ran (every sequence stopped at its "
        "first token)\n",
        o.trace);
  }
}

int run_generate(const GenerateOptions& o, std::ostream& out) {
  // Every option is checked before anything is written, loaded or created.
  CheckedOptions c = check_options(o);
  std::mt19937_64 rng(o.seed);
  RemovedAtExit temporary;
  models::ModelSource source = models::ModelSource::open(model_folder(o, c.dtype, temporary));
  if (o.dtype.empty()) c.dtype = source.stored_dtype().value_or(DType::kF32);
  const Prompts p = encode_prompts(o, c, source);
  (void)source.config().transformer_config();  // refuses what numesh cannot run, before the load

  progress(o.quiet, fmt::format("loading {} ({} model) ...", source.path().string(),
                                to_string(source.config().architecture)));
  LoadedModel m =
      load_model(o, c, std::move(source), static_cast<std::int64_t>(p.ids.size()), p.max_len);
  report_load(o, c, m, out);

  // --trace: the decode steps' program (one new token a sequence) timed node by node; each run
  // overwrites the last one's timings, so the trace is the last step's.
  runtime::CompiledGraph* traced =
      c.trace_file.is_open() ? &m.engine->model().stack().program(1).graph() : nullptr;
  if (traced != nullptr) traced->set_timing(true);
  const Generated g = generate_and_print(o, c, *m.engine, p, rng, out);
  const BaselineReport baselines = measure_baselines(o, p, m, g.result);
  report_rates(p, g.result, baselines, out);
  if (traced != nullptr) write_trace(o, c, *traced, g.result, out);
  if (!o.logits_out.empty() && command_world()->rank() == 0) {
    const std::int64_t vocab = m.engine->config().vocab_size;
    runtime::HostTensor all = runtime::HostTensor::zeros(
        {static_cast<std::int64_t>(g.result.logits.front().size()) / vocab, vocab});
    all.data = g.result.logits.front();
    c.logits_file.close();
    models::save_npy(o.logits_out, all);
    out << fmt::format("logits   [{}, {}] written to {}\n", all.shape[0], all.shape[1],
                       o.logits_out);
  }
  if (c.json_file.is_open()) write_json(o, c, p, m, g, baselines);
  return 0;
}

}  // namespace numesh::tools
