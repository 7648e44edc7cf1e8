#include "kv_dtype_option.hpp"

#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include "numesh/core/error.hpp"

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

DType parse_kv_dtype(std::string_view text) {
  const auto refuse = [&] {
    return ValueError(
        fmt::format("--kv-dtype '{}': expected f32, bf16 or f16 (how the KV caches store keys "
                    "and values)",
                    text));
  };
  DType dtype;
  try {
    dtype = parse_dtype(text);
  } catch (const ValueError&) {
    throw refuse();
  }
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) throw refuse();
  return dtype;
}

}  // namespace numesh::tools
