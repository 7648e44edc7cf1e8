#include "kv_dtype_option.hpp"

#include <CLI/CLI.hpp>

namespace numesh::tools {

void add_kv_dtype_option(CLI::App& cmd, std::string& value) {
  cmd.add_option("--kv-dtype", value,
                 "How the KV caches store keys and values: f32, or bf16 or f16 in half the bytes "
                 "(each key and value rounded to nearest even as it is written; attention reads "
                 "them widened exactly, so a long context's decode reads half the cache and the "
                 "same memory holds twice the tokens). Needs a head size that is a multiple of "
                 "16")
      ->capture_default_str();
}

}  // namespace numesh::tools
