#pragma once

// --mmap, for every command that loads a model's weights (generate, perplexity, serve): whether
// the matrices read the model file's pages in place or copies in each device's memory
// (models::WeightMapping).

#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace numesh::tools {

/// Adds `--mmap auto|on|off` to `cmd`, stored in `value` as given (default "auto"; the command
/// parses it with models::parse_weight_mapping, whose error names a bad value).
void add_mmap_option(CLI::App& cmd, std::string& value);

}  // namespace numesh::tools
