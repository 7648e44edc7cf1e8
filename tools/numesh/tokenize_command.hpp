#pragma once

// `numesh tokenize`: a model folder's tokenizer (tokenizer.json, or SentencePiece's
// tokenizer.model) applied to a text (the ids) or to ids (the text), exactly as Hugging Face's
// tokenizers and SentencePiece give them. Needs only the tokenizer files.

#include <iosfwd>
#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace numesh::tools {

/// The options of `numesh tokenize`.
struct TokenizeOptions {
  std::string model;        ///< --model DIR, a tokenizer file or a GGUF model
  std::string text;         ///< --text TEXT: encode it
  std::string decode;       ///< --decode 1,2,3: decode them
  bool no_special = false;  ///< --no-special: no BOS on encode; special tokens dropped on decode
  bool json = false;        ///< --json: {"ids": [...]} or {"text": "..."}
};

/// Registers `tokenize`. Not thread-safe (CLI11 setup).
CLI::App* add_tokenize_command(CLI::App& app, TokenizeOptions& options);

/// Encodes or decodes and prints the result to `out`. Returns 0.
/// Throws: numesh::Error naming the bad option, file, field or id.
int run_tokenize(const TokenizeOptions& options, std::ostream& out);

}  // namespace numesh::tools
