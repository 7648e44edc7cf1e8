#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "numesh/models/formats/gguf.hpp"

// Writing GGUF files (version 3, little-endian), laid out as ggml's own writer lays them out
// (src/gguf.cpp, gguf_write_to_file): the header, the metadata in the order it was added, the
// tensor infos, padding to the alignment, then each tensor's bytes padded to the alignment, each
// tensor's offset the running sum of the padded sizes before it. Tensors are produced one at a
// time by a callback as the file is written, so a model is converted without holding it whole.

namespace numesh::models {

/// A GGUF file being assembled. Not thread-safe; write() may be called more than once.
class GgufWriter {
 public:
  /// Fills a tensor's bytes (exactly its size: GgufWriter::tensor_bytes).
  using Fill = std::function<void(std::span<std::byte> bytes)>;

  /// A writer whose tensors start at multiples of `alignment` (ggml's default 32; another value
  /// is written as general.alignment, first).
  /// Throws: ValueError when `alignment` is not a power of two.
  explicit GgufWriter(std::uint32_t alignment = 32);

  /// Metadata, one key at a time, in the order given. Throws: ValueError naming a key given
  /// twice or empty.
  void add_uint32(std::string key, std::uint32_t value);
  void add_int32(std::string key, std::int32_t value);
  void add_float32(std::string key, float value);
  void add_bool(std::string key, bool value);
  void add_string(std::string key, std::string value);
  void add_strings(std::string key, std::vector<std::string> values);
  void add_float32s(std::string key, std::vector<float> values);
  void add_int32s(std::string key, std::vector<std::int32_t> values);
  /// A value of an open GgufFile, as it is (its type and elements).
  void add_value(std::string key, const GgufValue& value);

  /// Whether metadata key `key` has been added.
  [[nodiscard]] bool contains(std::string_view key) const noexcept;

  /// A tensor of `shape` (NumPy order, outermost first; stored innermost first) and `type`,
  /// its bytes given by `fill` when the file is written.
  /// Throws: ValueError naming the tensor when its name is empty, 64 bytes or longer, or given
  /// twice, when it has no dims or more than 4, a negative extent, or rows that are not whole
  /// blocks of `type`.
  void add_tensor(std::string name, std::vector<std::int64_t> shape, GgufType type, Fill fill);

  /// The bytes a tensor of `shape` and `type` takes.
  [[nodiscard]] static std::uint64_t tensor_bytes(std::span<const std::int64_t> shape,
                                                  GgufType type) noexcept;

  /// Writes the file, calling each tensor's `fill` once, in order: into a temporary file beside
  /// it, renamed over `file` once complete, so that a failure leaves `file` as it was (and a
  /// `fill` reading a mapping of `file` itself reads the old file to the end).
  /// Throws: IoError naming the file when it cannot be written or renamed; what a `fill` throws
  /// (the temporary file is removed).
  void write(const std::filesystem::path& file) const;

 private:
  struct Tensor {
    std::string name;
    std::vector<std::int64_t> shape;
    GgufType type;
    Fill fill;
  };
  void add_key(std::string key, GgufValueType type, std::string payload);

  std::uint32_t alignment_;
  std::vector<std::string> keys_;
  std::string metadata_;  // the key-value pairs, serialized
  std::vector<Tensor> tensors_;
};

}  // namespace numesh::models
