#pragma once

// The safetensors and GGUF fuzzers' check of a box read in place (Checkpoint::box_in_place's
// file-level calls) against the copying read.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "numesh/core/dtype.hpp"
#include "numesh/runtime/tensor.hpp"

namespace numesh::fuzz {

/// When `file.box_in_place(name, offsets, sizes, format)` gives a pointer, its run of
/// storage_bytes(format, sizes) bytes must lie inside the tensor's `stored` bytes and equal what
/// read_box copies in the same format; aborts otherwise. (Any file type with both calls:
/// SafetensorsFile, GgufFile.)
template <class File>
void check_box_in_place(const File& file, const std::string& name,
                        std::span<const std::byte> stored, const std::vector<std::int64_t>& offsets,
                        const std::vector<std::int64_t>& sizes, DType format) {
  const std::shared_ptr<const std::byte> run = file.box_in_place(name, offsets, sizes, format);
  if (run == nullptr) return;
  const auto bytes = static_cast<std::size_t>(runtime::storage_bytes(format, sizes));
  if (run.get() < stored.data() || run.get() + bytes > stored.data() + stored.size()) std::abort();
  std::vector<std::byte> copied(bytes);
  file.read_box(name, offsets, sizes, format, copied);
  if (bytes > 0 && std::memcmp(run.get(), copied.data(), bytes) != 0) std::abort();
}

}  // namespace numesh::fuzz
