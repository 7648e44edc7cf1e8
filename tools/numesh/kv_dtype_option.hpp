#pragma once

// --kv-dtype, for every command that keeps a model's KV caches (generate, perplexity, serve):
// how the caches store keys and values (ops::KvCache::create). The commands parse it with
// models::parse_kv_dtype, whose error names a bad value.

#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace numesh::tools {

/// Adds `--kv-dtype f32|bf16|f16` to `cmd`, stored in `value` as given (default "f32").
void add_kv_dtype_option(CLI::App& cmd, std::string& value);

}  // namespace numesh::tools
