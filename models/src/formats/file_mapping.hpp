#pragma once

// PRIVATE to models/src: a model file opened and mapped whole, read-only, the first step of
// every memory-mapped format (safetensors, GGUF). The caller owns the mapping (munmap with its
// size) and validates what is in it.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string_view>

namespace numesh::models::detail {

/// A mapped file: its first byte and its size.
struct FileMapping {
  const std::byte* address = nullptr;
  std::uint64_t size = 0;
};

/// Opens `file` and maps all of it read-only and private (nothing can be written back through
/// the mapping); the descriptor is closed before returning. `where` starts every message;
/// `min_bytes` is the least the format needs, `min_text` names it ("the 8 of the header
/// length").
/// Throws: IoError "<where>: <the OS's error>" when the file cannot be opened, examined or
/// mapped; "<where>: it is a directory" / "it is not a regular file"; "<where>: file ends
/// early: it has N bytes, fewer than <min_text>" when it has fewer than `min_bytes`.
FileMapping map_file(const std::filesystem::path& file, std::string_view where,
                     std::uint64_t min_bytes, std::string_view min_text);

}  // namespace numesh::models::detail
