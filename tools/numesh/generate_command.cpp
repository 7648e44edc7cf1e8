#include "generate_command.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <ostream>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/timing.hpp"
#include "numesh/models/causal_lm.hpp"
#include "numesh/models/hf_config.hpp"
#include "numesh/models/hf_weights.hpp"
#include "numesh/models/random_model.hpp"
#include "numesh/models/safetensors_checkpoint.hpp"
#include "numesh/models/text_tokenizer.hpp"
#include "numesh/ops/lowering/lm_head.hpp"
#include "numesh/ops/npy.hpp"
#include "numesh/ops/reference/lm_head.hpp"
#include "bench_common.hpp"
#include "parsers.hpp"

namespace numesh::tools {

namespace {

using Clock = std::chrono::steady_clock;

void progress(bool quiet, const std::string& text) {
  if (quiet) return;
  std::fprintf(stderr, "%s\n", text.c_str());
  std::fflush(stderr);
}

}  // namespace

CLI::App* add_generate_command(CLI::App& app, GenerateOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "generate",
      "Generate tokens from a Hugging Face checkpoint (config.json + safetensors) on the machine's mesh: greedy "
      "or sampled decoding of a prompt (text or token ids), the ids streamed as they come, with load, prefill "
      "and decode rates.");
  cmd->footer(R"(Models: llama, mistral, qwen2, qwen3, mixtral and qwen3_moe checkpoints (F32, BF16 or F16 safetensors, one file or
shards with model.safetensors.index.json). Without --model, a small random Llama is written in
Hugging Face layout (to --random-model DIR, or a temporary folder) and loaded back through the
same path. --prompt needs the folder's tokenizer: tokenizer.json (byte-level BPE: Llama 3,
Qwen2/3) or tokenizer.model (SentencePiece: Llama 2, Mistral); the random model has none, so it
takes --ids.
Examples:
  numesh generate --ids 1,450,4996 --max-new-tokens 16
  numesh generate --model ~/models/Llama-3.2-1B --prompt "The capital of France is" --dtype bf16
  numesh generate --model DIR --ids 1,2,3 --dims 1,1,2 --logits-out logits.npy
  numesh generate --model DIR --prompt "Once upon a time" --temperature 0.8 --top-k 40 --top-p 0.95 --seed 7)");
  add_mesh_options(*cmd, o.mesh, /*with_threads=*/true);
  cmd->add_option("--model", o.model, "Folder of a Hugging Face checkpoint (config.json, *.safetensors)");
  cmd->add_option("--random-model", o.random_model,
                  "Write a random Llama in Hugging Face layout to DIR and generate from it (the default without "
                  "--model, in a temporary folder)");
  cmd->add_option("--random-hidden", o.random_hidden, "The random model's hidden size (a multiple of 64)")
      ->capture_default_str();
  cmd->add_option("--random-layers", o.random_layers, "The random model's layers")->capture_default_str();
  cmd->add_option("--ids", o.ids, "The prompt's token ids, comma-separated");
  cmd->add_option("--prompt", o.prompt,
                  "The prompt as text, encoded by the model's tokenizer.json or tokenizer.model (with BOS)");
  cmd->add_option("--max-new-tokens", o.max_new_tokens, "Tokens to generate at most")->capture_default_str();
  cmd->add_flag("--ignore-eos", o.ignore_eos, "Do not stop at the model's end-of-sequence ids");
  cmd->add_flag("--greedy", o.greedy, "Pick the most likely token (the default)");
  cmd->add_option("--temperature", o.temperature,
                  "Sample instead, from the logits divided by T > 0 (then --top-k, --top-p, --seed)");
  cmd->add_option("--top-k", o.top_k, "Sampling: keep the K most likely tokens (only they leave the devices)")
      ->capture_default_str();
  cmd->add_option("--top-p", o.top_p, "Sampling: then the most likely whose probabilities sum to P")
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "Sampling: the generator's seed (the same seed gives the same tokens)")
      ->capture_default_str();
  cmd->add_option("--dtype", o.dtype,
                  "How the devices store the matrices: f32, bf16 or f16 (norms and routers stay f32)")
      ->capture_default_str();
  cmd->add_option("--logits-out", o.logits_out,
                  "Write the logits as float32 .npy [P + N - 1, V]: every prompt position, then each decode step");
  cmd->add_option("--json", o.json, "Write the prompt, the ids and the timings as JSON to FILE");
  cmd->add_flag("--quiet", o.quiet, "No progress on stderr");
  return cmd;
}

int run_generate(const GenerateOptions& o, std::ostream& out) {
  // Every option is checked before anything is written, loaded or created.
  const DType dtype = parse_dtype(o.dtype);
  NUMESH_CHECK(o.model.empty() || o.random_model.empty(), ValueError,
               "--model and --random-model exclude each other: generate from a checkpoint, or write a random one");
  NUMESH_CHECK(o.prompt.empty() != o.ids.empty(), ValueError,
               "give the prompt as text with --prompt (the model's tokenizer encodes it) or as token ids with --ids, "
               "one of the two");
  NUMESH_CHECK(o.max_new_tokens >= 1 && o.max_new_tokens <= (std::int64_t{1} << 30), ValueError,
               "--max-new-tokens {} must be between 1 and 2^30", o.max_new_tokens);
  const bool sampling = o.temperature != 0.0;
  NUMESH_CHECK(!(sampling && o.greedy), ValueError,
               "--greedy and --temperature {} exclude each other: pick the most likely token, or sample", o.temperature);
  const ops::SamplingOptions sampling_options{.temperature = o.temperature, .top_k = o.top_k, .top_p = o.top_p};
  if (sampling) ops::validate(sampling_options);
  std::mt19937_64 rng(o.seed);
  std::vector<std::int32_t> prompt;
  if (!o.ids.empty()) {
    prompt = parse_token_ids(o.ids, "--ids");
  }
  check_mesh_options(o.mesh);
  // The output files are opened now, so that a path that cannot be written is refused before
  // the model loads (and the generation is not lost at the end).
  std::ofstream json_file = open_json_file(o.json);
  std::ofstream logits_file;
  if (!o.logits_out.empty()) {
    logits_file.open(o.logits_out, std::ios::binary);
    NUMESH_CHECK(logits_file.is_open(), IoError, "cannot write --logits-out file '{}'", o.logits_out);
  }

  std::filesystem::path dir = o.model;
  // Without --random-model the random model goes to a folder of this process's own, removed at
  // the end (a shared one would be rewritten under another run's mapping).
  struct RemovedAtExit {
    std::filesystem::path path;
    ~RemovedAtExit() {
      std::error_code ignored;
      if (!path.empty()) std::filesystem::remove_all(path, ignored);
    }
  } temporary;
  if (o.model.empty()) {
    if (o.random_model.empty()) {
      temporary.path = std::filesystem::temp_directory_path() / fmt::format("numesh-random-model-{}", ::getpid());
    }
    dir = !o.random_model.empty() ? std::filesystem::path(o.random_model) : temporary.path;
    NUMESH_CHECK(!std::filesystem::exists(dir / "model.safetensors.index.json"), ValueError,
                 "--random-model {}: the folder holds a sharded checkpoint (model.safetensors.index.json), which the "
                 "random model's files would not replace; give an empty or new folder",
                 dir.string());
    NUMESH_CHECK(o.random_hidden > 0 && o.random_hidden % 64 == 0 && o.random_layers >= 1, ValueError,
                 "--random-hidden {} must be a positive multiple of 64 and --random-layers {} positive",
                 o.random_hidden, o.random_layers);
    progress(o.quiet, fmt::format("writing a random Llama (hidden {}, {} layers) to {} ...", o.random_hidden,
                                  o.random_layers, dir.string()));
    models::write_random_model(dir, models::small_llama_config(o.random_hidden, o.random_layers), dtype, 1234);
  }
  const models::HfConfig config = models::HfConfig::load(dir);
  // The tokenizer, when the folder has one: it encodes --prompt and turns the ids into text.
  std::unique_ptr<models::TextTokenizer> tokenizer;
  if (std::filesystem::exists(dir / "tokenizer.json") || std::filesystem::exists(dir / "tokenizer.model")) {
    tokenizer = models::TextTokenizer::load(dir);
  }
  if (!o.prompt.empty()) {
    NUMESH_CHECK(tokenizer != nullptr, IoError,
                 "--prompt: {} has no tokenizer.json or tokenizer.model to encode it; give the prompt's token ids "
                 "with --ids",
                 dir.string());
    prompt = tokenizer->encode(o.prompt, /*add_special_tokens=*/true);
    NUMESH_CHECK(!prompt.empty(), ValueError, "--prompt '{}' encodes to no token", o.prompt);
  }
  for (std::size_t i = 0; i < prompt.size(); ++i) {
    NUMESH_CHECK(prompt[i] < config.vocab_size, IndexError,
                 "{}: token {} at position {} is outside the model's vocabulary [0, {})",
                 o.prompt.empty() ? "--ids" : "--prompt", prompt[i], i, config.vocab_size);
  }
  const auto p = static_cast<std::int64_t>(prompt.size());
  const std::int64_t max_len = p + o.max_new_tokens;
  NUMESH_CHECK(max_len <= config.max_context(), ValueError,
               "{} prompt tokens and --max-new-tokens {} make a context of {}, longer than the model's {}", p,
               o.max_new_tokens, max_len, config.max_context());
  (void)config.transformer_config();  // refuses what numesh cannot run, before reading weights

  progress(o.quiet, fmt::format("loading {} ({} model) ...", dir.string(), to_string(config.architecture)));
  const auto load_start = Clock::now();
  const auto checkpoint = models::SafetensorsCheckpoint::open(dir);
  std::int64_t bytes = 0;
  for (const std::string& name : checkpoint.names()) bytes += static_cast<std::int64_t>(checkpoint.info(name).size_bytes());
  const models::CausalLmWeights weights = models::CausalLmWeights::load(config, checkpoint, dtype);
  const runtime::DeviceMesh mesh = make_mesh(o.mesh);
  models::CausalLm lm(mesh, config, weights, 1, max_len);
  const double load_seconds = seconds_since(load_start);

  out << fmt::format("numesh generate: {} ({} model, {} layers, hidden {}, vocabulary {}), {} weights, mesh {}\n",
                     dir.string(), to_string(config.architecture), config.num_hidden_layers, config.hidden_size,
                     config.vocab_size, to_string(dtype), mesh.mesh().repr());
  out << fmt::format("load     {:.1f} MB in {:.3f} s ({:.2f} GB/s, read, converted and laid out)\n",
                     static_cast<double>(bytes) / 1e6,
                     load_seconds, static_cast<double>(bytes) / load_seconds / 1e9);
  out << fmt::format("prompt   {}\n", fmt::join(prompt, " "));
  out << "ids     ";
  out.flush();
  // With a tokenizer the text follows the ids, decoded once at the end (a token can end inside
  // a character, so decoding token by token would print broken characters). A model's
  // vocabulary can be larger than its tokenizer's (padded embeddings; a random model beside a
  // small tokenizer): ids the tokenizer lacks are left out of the text, and counted.
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

  const bool want_logits = !o.logits_out.empty();
  std::vector<float> logits_rows;  // [P + N - 1, V] when --logits-out
  const auto step = [&](std::span<const std::int32_t> ids, std::int64_t tokens, std::int64_t position) {
    if (!want_logits) {
      return sampling ? lm.sample(ids, tokens, position, sampling_options, rng).front()
                      : lm.greedy(ids, tokens, position).front();
    }
    // --logits-out: the whole logits come to the host, and the pick is made from the last row
    // with the same rules (every token a candidate).
    const runtime::HostTensor l = lm.logits(ids, tokens, position);
    logits_rows.insert(logits_rows.end(), l.data.begin(), l.data.end());
    const std::int64_t v = l.shape[1];
    if (!sampling) {
      runtime::HostTensor last = runtime::HostTensor::zeros({1, v});
      std::copy(l.data.end() - v, l.data.end(), last.data.begin());
      return ops::argmax_rows(last).front();
    }
    runtime::HostTensor candidates = runtime::HostTensor::zeros({1, 2 * v});
    for (std::int64_t j = 0; j < v; ++j) {
      candidates.data[static_cast<std::size_t>(2 * j)] = l.data[static_cast<std::size_t>(l.data.size()) - static_cast<std::size_t>(v - j)];
      candidates.data[static_cast<std::size_t>(2 * j + 1)] = static_cast<float>(j);
    }
    return ops::pick_sampled(candidates, sampling_options, rng).front();
  };
  const auto eos = [&](std::int64_t id) {
    return !o.ignore_eos && std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), id) !=
                                config.eos_token_ids.end();
  };
  std::vector<std::int64_t> generated;
  const auto prefill_start = Clock::now();
  std::int64_t next = step(prompt, p, 0);
  const double prefill_seconds = seconds_since(prefill_start);
  generated.push_back(next);
  out << " " << next;
  out.flush();
  const auto decode_start = Clock::now();
  while (static_cast<std::int64_t>(generated.size()) < o.max_new_tokens && !eos(next)) {
    const std::int32_t fed = static_cast<std::int32_t>(next);
    next = step(std::span<const std::int32_t>(&fed, 1), 1, p + static_cast<std::int64_t>(generated.size()) - 1);
    generated.push_back(next);
    out << " " << next;
    out.flush();
  }
  const double decode_seconds = seconds_since(decode_start);
  const auto decoded = static_cast<std::int64_t>(generated.size()) - 1;
  const char* stopped = eos(next) ? "end-of-sequence id" : "--max-new-tokens";
  out << fmt::format("\nstopped  at {} ({} tokens)\n", stopped, generated.size());
  std::string text;
  if (tokenizer) {
    text = text_of(generated);
    out << fmt::format("text     {}{}\n", o.prompt.empty() ? text_of(prompt) : o.prompt, text);
    if (unknown_ids > 0) {
      out << fmt::format("         ({} ids are outside the tokenizer's vocabulary of {} and left out of the text)\n",
                         unknown_ids, tokenizer->vocab_size());
    }
  }
  out << fmt::format("prefill  {} tokens in {:.2f} ms ({:.0f} tokens/s)\n", p, prefill_seconds * 1e3,
                     static_cast<double>(p) / prefill_seconds);
  if (decoded > 0) {
    out << fmt::format("decode   {} tokens, {:.2f} ms per token ({:.1f} tokens/s)\n", decoded,
                       decode_seconds * 1e3 / static_cast<double>(decoded),
                       static_cast<double>(decoded) / decode_seconds);
  }
  if (want_logits) {
    runtime::HostTensor all = runtime::HostTensor::zeros(
        {static_cast<std::int64_t>(logits_rows.size()) / config.vocab_size, config.vocab_size});
    all.data = std::move(logits_rows);
    logits_file.close();
    ops::save_npy(o.logits_out, all);
    out << fmt::format("logits   [{}, {}] written to {}\n", all.shape[0], all.shape[1], o.logits_out);
  }
  if (json_file.is_open()) {
    json_file << nlohmann::json{{"model", dir.string()},
                        {"architecture", std::string(to_string(config.architecture))},
                        {"dtype", std::string(to_string(dtype))},
                        {"mesh", mesh.mesh().repr()},
                        {"prompt_ids", prompt},
                        {"ids", generated},
                        {"text", tokenizer ? nlohmann::json(text) : nlohmann::json(nullptr)},
                        {"stopped", stopped},
                        {"sampling", sampling ? nlohmann::json{{"temperature", o.temperature},
                                                               {"top_k", o.top_k},
                                                               {"top_p", o.top_p},
                                                               {"seed", o.seed}}
                                              : nlohmann::json("greedy")},
                        {"load_seconds", load_seconds},
                        {"load_bytes", bytes},
                        {"prefill_seconds", prefill_seconds},
                        {"prefill_tokens_per_second", static_cast<double>(p) / prefill_seconds},
                        {"decode_tokens", decoded},
                        {"decode_seconds", decode_seconds},
                        {"decode_tokens_per_second",
                         decoded > 0 ? static_cast<double>(decoded) / decode_seconds : 0.0}}
                         .dump(2)
      << "\n";
  }
  return 0;
}

}  // namespace numesh::tools
