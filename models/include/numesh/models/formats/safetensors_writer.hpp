#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "numesh/core/dtype.hpp"
#include "numesh/runtime/tensor.hpp"

// Writing safetensors files: what numesh needs to save a model it made (the random checkpoints
// of `numesh generate --random-model` and the tests), laid out as the official writer lays a
// file out, so that every reader (numesh's, the Rust crate, transformers) opens it.

namespace numesh::models {

/// One tensor to write: its name, its fp32 values and shape, and the dtype to store it as.
struct TensorToWrite {
  std::string name;
  const runtime::HostTensor* values = nullptr;
  DType dtype = DType::kF32;
};

/// Writes `tensors` to `file` (replacing it whole: written beside it, then renamed over it, so
/// that a process reading the old file's mapping keeps its bytes): the header's length, a
/// compact JSON header ("__metadata__" first when `metadata` is not empty, then the tensors in
/// the Rust writer's order: wider dtypes first, then by name) padded with spaces to a multiple
/// of 8 bytes, and the tensors' bytes back to back in that order, little-endian, 16-bit dtypes
/// rounded to nearest even.
/// REQUIRES: every `values` is not null.
/// Throws: ValueError naming a tensor listed twice or with an empty name; IoError naming the
/// file when it cannot be written.
void write_safetensors(const std::filesystem::path& file, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace numesh::models
