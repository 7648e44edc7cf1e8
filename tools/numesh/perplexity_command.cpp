#include "perplexity_command.hpp"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <sstream>

#include "bench_common.hpp"
#include "kv_dtype_option.hpp"
#include "mmap_option.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/progress_line.hpp"
#include "numesh/models/engine/engine.hpp"
#include "numesh/models/engine/model_source.hpp"
#include "numesh/models/hf/hf_config.hpp"
#include "numesh/models/hf/hf_weights.hpp"
#include "numesh/models/lm/causal_lm.hpp"
#include "numesh/models/lm/perplexity.hpp"
#include "numesh/models/tokenizers/text_tokenizer.hpp"
#include "ranks.hpp"

namespace numesh::tools {

CLI::App* add_perplexity_command(CLI::App& app, PerplexityOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "perplexity",
      "A model's perplexity over a text file, as llama.cpp's llama-perplexity computes it.");
  cmd->footer(
      R"(The file is tokenized with the model's tokenizer and cut into chunks of --context tokens;
each chunk runs from position 0 with BOS as its first token (when the tokenizer adds one) and only
its second half is scored, so every scored token sees at least context/2 tokens before it.
Prints the running perplexity after each chunk, then the estimate with its standard error.
Example:
  numesh perplexity --model ~/models/Llama-3.2-1B --text-file wiki.test.raw --context 512 --dtype bf16)");
  add_mesh_options(*cmd, o.mesh, /*with_threads=*/true);
  cmd->add_option("--model", o.model,
                  "Model folder (config.json, *.safetensors, tokenizer.json or tokenizer.model), "
                  "or a GGUF file")
      ->required();
  cmd->add_option("--text-file", o.text_file, "The text to score (UTF-8)")->required();
  cmd->add_option("--context", o.context, "Tokens per chunk")->capture_default_str();
  cmd->add_option(
      "--dtype", o.dtype,
      fmt::format("How the devices store the matrices: {} (blocks quantized at load). Default: a "
                  "GGUF file's matrices each in the format the file stores it in (a Q4_K_M "
                  "file's Q4_K and Q6_K), f32 otherwise",
                  dtype_choices()));
  add_mmap_option(*cmd, o.mmap);
  add_kv_dtype_option(*cmd, o.kv_dtype);
  cmd->add_option("--json", o.json, "Write the result as JSON to FILE");
  cmd->add_flag("--quiet", o.quiet, "No progress: the load's (on a terminal) and each chunk's");
  return cmd;
}

int run_perplexity(const PerplexityOptions& o, std::ostream& out) {
  DType dtype = o.dtype.empty() ? DType::kF32 : parse_dtype(o.dtype);
  const models::WeightMapping mapping = models::parse_weight_mapping(o.mmap);
  const DType kv_dtype = models::parse_kv_dtype(o.kv_dtype);
  NUMESH_CHECK(o.context >= 4, ValueError, "--context {} must be at least 4", o.context);
  check_mesh_options(o.mesh);
  // Under mpirun the ranks evaluate alike and rank 0 alone writes.
  std::ofstream json_file = command_world()->rank() == 0 ? open_json_file(o.json) : std::ofstream();
  std::ifstream file(o.text_file, std::ios::binary);
  NUMESH_CHECK(file.good(), IoError, "--text-file: cannot read '{}'", o.text_file);
  std::stringstream text;
  text << file.rdbuf();
  const std::filesystem::path dir = o.model;
  const models::ModelSource source = models::ModelSource::open(dir);
  const models::HfConfig& config = source.config();
  const models::TextTokenizer* tokenizer = source.tokenizer();
  NUMESH_CHECK(tokenizer != nullptr, IoError,
               "--model '{}' has no tokenizer (tokenizer.json or tokenizer.model), which "
               "perplexity needs to read the text",
               dir.string());
  // As llama.cpp: the text tokenized with the tokenizer's special tokens, and every chunk
  // started with BOS when the tokenizer adds one (its template's first token on an empty text).
  const std::vector<std::int32_t> tokens =
      tokenizer->encode(text.str(), /*add_special_tokens=*/true);
  const std::vector<std::int32_t> special = tokenizer->encode("", /*add_special_tokens=*/true);
  const std::optional<std::int32_t> bos =
      special.empty() ? std::nullopt : std::optional(special.front());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    NUMESH_CHECK(tokens[i] < config.vocab_size, IndexError,
                 "--text-file: token {} at position {} of the text is outside the model's "
                 "vocabulary [0, {})",
                 tokens[i], i, config.vocab_size);
  }
  NUMESH_CHECK(static_cast<std::int64_t>(tokens.size()) >= o.context, ValueError,
               "--text-file '{}' is {} tokens; --context {} needs at least that many (one chunk)",
               o.text_file, tokens.size(), o.context);
  NUMESH_CHECK(o.context <= config.max_context(), ValueError,
               "--context {} is longer than the model's {}", o.context, config.max_context());
  (void)config.transformer_config();
  const std::unique_ptr<models::Checkpoint> checkpoint = source.open_checkpoint();
  // Without --dtype, a GGUF model's matrices as the file stores each (a Q4_K_M file's Q6_K
  // ones stay Q6_K).
  const models::WeightFormats formats =
      o.dtype.empty() && source.stored_dtype()
          ? models::WeightFormats::as_stored(*checkpoint, *source.stored_dtype())
          : models::WeightFormats(dtype);
  std::optional<models::CausalLm> loaded;
  {
    const ProgressLine line(o.quiet);
    loaded.emplace(models::CausalLm::load(
        make_mesh(o.mesh), config, *checkpoint, 1, o.context, formats, {},
        [&](std::int64_t done, std::int64_t total) {
          line.update(load_progress_text(done, total));
        },
        mapping, kv_dtype));
  }
  models::CausalLm& lm = *loaded;

  out << fmt::format(
      "numesh perplexity: {} ({} model), {} weights, {} KV cache; {} tokens of {}, chunks of {} "
      "({} of them)\n",
      dir.string(), to_string(config.architecture), to_string(formats), to_string(kv_dtype),
      tokens.size(), o.text_file, o.context, static_cast<std::int64_t>(tokens.size()) / o.context);
  out.flush();
  const auto start = std::chrono::steady_clock::now();
  const models::PerplexityResult r =
      models::perplexity(lm, tokens, o.context, bos, [&](std::int64_t chunk, double ppl) {
        if (o.quiet) return;
        out << fmt::format("[{}]{:.4f},", chunk, ppl);
        out.flush();
      });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!o.quiet) out << "\n";
  out << fmt::format(
      "perplexity {:.4f} +/- {:.4f} over {} scored tokens ({} chunks, {:.0f} tokens/s)\n",
      r.perplexity, r.standard_error, r.scored, r.chunks,
      static_cast<double>(r.chunks * o.context) / seconds);
  if (json_file.is_open()) {
    json_file << nlohmann::json{{"model", dir.string()},
                                {"dtype", to_string(formats)},
                                {"kv_dtype", std::string(to_string(kv_dtype))},
                                {"context", o.context},
                                {"chunks", r.chunks},
                                {"scored_tokens", r.scored},
                                {"mean_nll", r.mean_nll},
                                {"perplexity", r.perplexity},
                                {"standard_error", r.standard_error},
                                {"running", r.running},
                                {"seconds", seconds}}
                     .dump(2)
              << "\n";
  }
  return 0;
}

}  // namespace numesh::tools
