#pragma once

// Test helper: safetensors files built byte by byte, so that every test states exactly what is
// on disk (a well-formed layout, or one broken rule) without a Python writer.

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace numesh::models::testing {

/// One tensor of a file built by layout_file(): its header fields and stored bytes.
struct StoredTensor {
  std::string name;
  std::string dtype;  // the header's spelling: "F32", "BF16", ...
  std::vector<std::int64_t> shape;
  std::string data;  // the stored bytes, little-endian
};

/// The little-endian bytes of `values` (this machine is little-endian, as safetensors is).
template <typename T>
std::string le_bytes(const std::vector<T>& values) {
  static_assert(std::endian::native == std::endian::little);
  std::string out(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

/// A whole file: the 8-byte little-endian length of `header`, `header`, then `buffer`.
inline std::string file_bytes(std::string_view header, std::string_view buffer = {}) {
  std::string out;
  for (int i = 0; i < 8; ++i) {
    out += static_cast<char>((static_cast<std::uint64_t>(header.size()) >> (8 * i)) & 0xFFU);
  }
  out += header;
  out += buffer;
  return out;
}

/// A JSON array of integers: "[2, 3]".
inline std::string json_ints(const std::vector<std::int64_t>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(values[i]);
  }
  return out + "]";
}

/// A well-formed file holding `tensors` back to back in the given order (also the header's
/// order), with `metadata` as "__metadata__" when not empty. The header is padded with spaces
/// to a multiple of `align` bytes (8, as the Rust writer does, puts the buffer at an 8-byte
/// boundary; other values leave it misaligned on purpose). Names need no JSON escaping.
inline std::string layout_file(const std::vector<StoredTensor>& tensors,
                               const std::map<std::string, std::string>& metadata = {},
                               std::size_t align = 8) {
  std::string header = "{";
  bool first = true;
  if (!metadata.empty()) {
    header += "\"__metadata__\": {";
    for (const auto& [key, value] : metadata) {
      if (!first) header += ", ";
      first = false;
      header += "\"" + key + "\": \"" + value + "\"";
    }
    header += "}";
  }
  std::string buffer;
  for (const StoredTensor& t : tensors) {
    if (!std::exchange(first, false)) header += ", ";
    const auto begin = static_cast<std::int64_t>(buffer.size());
    buffer += t.data;
    header +=
        "\"" + t.name + "\": {\"dtype\": \"" + t.dtype + "\", \"shape\": " + json_ints(t.shape) +
        ", \"data_offsets\": " + json_ints({begin, static_cast<std::int64_t>(buffer.size())}) + "}";
  }
  header += "}";
  while ((8 + header.size()) % align != 0) header += ' ';
  return file_bytes(header, buffer);
}

/// Writes `bytes` to `file`, replacing it.
inline void write_file(const std::filesystem::path& file, std::string_view bytes) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << file;
}

/// A fresh, empty directory for the running test, removed by the destructor.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::path(::testing::TempDir()) /
            (std::string("numesh_models_") + info->test_suite_name() + "_" + info->name());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

  /// Writes `bytes` to `name` in the directory and returns its path.
  std::filesystem::path file(const std::string& name, std::string_view bytes) const {
    const std::filesystem::path f = path_ / name;
    write_file(f, bytes);
    return f;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace numesh::models::testing
