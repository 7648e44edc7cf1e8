#pragma once

// `numesh convert`: a model (a Hugging Face folder or a GGUF file) written as a GGUF file that
// llama.cpp loads and numesh reads back, its matrices in the format asked for
// (models/engine/gguf_export.hpp).

#include <iosfwd>
#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace numesh::tools {

/// The options of `numesh convert`.
struct ConvertOptions {
  std::string model;         ///< --model DIR or FILE.gguf
  std::string out;           ///< --out FILE.gguf
  std::string type = "f16";  ///< --type: the matrices' format
  bool quiet = false;        ///< --quiet: no progress on stderr
};

/// Registers `convert`. Not thread-safe (CLI11 setup).
CLI::App* add_convert_command(CLI::App& app, ConvertOptions& options);

/// Converts and prints what was written to `out`. Returns 0.
/// Throws: numesh::Error naming the bad option, file or tensor.
int run_convert(const ConvertOptions& options, std::ostream& out);

}  // namespace numesh::tools
