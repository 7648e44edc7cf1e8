#pragma once

// --kv-dtype, for every command that keeps a model's KV caches (generate, perplexity, serve):
// how the caches store keys and values (ops::KvCache::create).

#include <string>
#include <string_view>

#include "numesh/core/dtype.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace numesh::tools {

/// Adds `--kv-dtype f32|bf16|f16` to `cmd`, stored in `value` as given (default "f32").
void add_kv_dtype_option(CLI::App& cmd, std::string& value);

/// The cache dtype `text` names: f32, bf16 or f16 (or their aliases, as parse_dtype).
/// Throws: ValueError naming `text` and the three values.
DType parse_kv_dtype(std::string_view text);

}  // namespace numesh::tools
