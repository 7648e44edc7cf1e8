#pragma once

// --kv-layout, for the commands that build a transformer's KV caches from random weights (run,
// bench decode): bhtd by default, the layout the models keep (models::CausalLm), or bthd. The
// commands parse it with parse_kv_layout (parsers.hpp), whose error names a bad value.

#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace numesh::tools {

/// Adds `--kv-layout bhtd|bthd` to `cmd`, stored in `value` as given (its default is value's
/// value: "bhtd" in run and bench decode).
void add_kv_layout_option(CLI::App& cmd, std::string& value);

}  // namespace numesh::tools
