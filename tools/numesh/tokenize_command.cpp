#include "tokenize_command.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/models/engine/model_source.hpp"
#include "numesh/models/hf/gguf_checkpoint.hpp"
#include "numesh/models/tokenizers/text_tokenizer.hpp"
#include "parsers.hpp"

namespace numesh::tools {

CLI::App* add_tokenize_command(CLI::App& app, TokenizeOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "tokenize",
      "Encode a text into token ids, or decode ids into text, with a model's tokenizer.");
  cmd->footer(
      R"(Reads DIR/tokenizer.json (byte-level BPE: Llama 3, Qwen2/3, DeepSeek V3, GPT-4o) or, when it is of
another kind or missing, DIR/tokenizer.model (SentencePiece: Llama 2, Mistral, TinyLlama); the
folder needs no weights. A GGUF model (FILE.gguf, or a folder holding one) gives the tokenizer of
its metadata (tokenizer.ggml.*). Ids and text are exactly those of Hugging Face's tokenizers and
of SentencePiece.
Examples:
  numesh tokenize --model ~/models/Llama-3.2-1B --text "Hello, world"
  numesh tokenize --model ~/models/qwen3-0.6b-q8_0.gguf --text "Hello, world"
  numesh tokenize --model ~/models/Llama-3.2-1B --decode 128000,9906,11,1917 --json)");
  cmd->add_option(
         "--model", o.model,
         "Model folder holding tokenizer.json or tokenizer.model (or the file itself), or a "
         "GGUF model")
      ->required();
  cmd->add_option("--text", o.text, "Text to encode");
  cmd->add_option("--decode", o.decode, "Token ids to decode, comma-separated");
  cmd->add_flag(
      "--no-special", o.no_special,
      "Encode without the template's special tokens (BOS); decode without special tokens");
  cmd->add_flag("--json", o.json, R"(Print {"ids": [...]} or {"text": "..."} instead)");
  return cmd;
}

int run_tokenize(const TokenizeOptions& o, std::ostream& out) {
  NUMESH_CHECK(o.text.empty() != o.decode.empty(), ValueError,
               "give a text to encode with --text or ids to decode with --decode, one of the two");
  // A GGUF model's tokenizer is built from its metadata, and lives in its ModelSource.
  std::optional<models::ModelSource> gguf;
  std::unique_ptr<models::TextTokenizer> from_files;
  const models::TextTokenizer* tokenizer = nullptr;
  if (models::GgufCheckpoint::is_gguf(o.model)) {
    gguf.emplace(models::ModelSource::open(o.model));
    tokenizer = gguf->tokenizer();
    NUMESH_CHECK(tokenizer != nullptr, ValueError,
                 "--model {}: the GGUF model holds no tokenizer (no tokenizer.ggml.model in its "
                 "metadata)",
                 o.model);
  } else {
    from_files = models::TextTokenizer::load(o.model);
    tokenizer = from_files.get();
  }
  if (!o.text.empty()) {
    const std::vector<std::int32_t> ids =
        tokenizer->encode(o.text, /*add_special_tokens=*/!o.no_special);
    if (o.json) {
      out << nlohmann::json{{"ids", ids}}.dump() << "\n";
    } else {
      out << fmt::format("{}\n", fmt::join(ids, " "));
    }
    return 0;
  }
  const std::vector<std::int32_t> ids = parse_token_ids(o.decode, "--decode");
  const std::string text = tokenizer->decode(ids, /*skip_special_tokens=*/o.no_special);
  if (o.json) {
    out << nlohmann::json{{"text", text}}.dump() << "\n";
  } else {
    out << text << "\n";
  }
  return 0;
}

}  // namespace numesh::tools
