#pragma once

// PRIVATE to models/src: a model file opened and mapped whole, read-only, the first step of
// every memory-mapped format (safetensors, GGUF). The mapping is shared: the file object holds
// it, and so does every weight that reads its bytes in place (Checkpoint::box_in_place); it is
// unmapped when the last of them lets go. The caller validates what is in it.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string_view>

namespace numesh::models::detail {

/// A mapped file: its first byte (unmapped when the last copy of the pointer goes) and its size.
struct FileMapping {
  std::shared_ptr<const std::byte> address;
  std::uint64_t size = 0;
};

/// Opens `file` and maps all of it read-only and private (nothing can be written back through
/// the mapping); the descriptor is closed before returning. A file of 2 MiB or more is mapped
/// at an address that is a multiple of 2 MiB, so that the kernel can map the page cache's large
/// folios whole (one fault and one TLB entry per 2 MiB for the weights read in place). `where`
/// starts every message; `min_bytes` is the least the format needs, `min_text` names it ("the 8 of
/// the header length"). Throws: IoError "<where>: <the OS's error>" when the file cannot be opened,
/// examined or mapped; "<where>: it is a directory" / "it is not a regular file"; "<where>: file
/// ends early: it has N bytes, fewer than <min_text>" when it has fewer than `min_bytes`.
FileMapping map_file(const std::filesystem::path& file, std::string_view where,
                     std::uint64_t min_bytes, std::string_view min_text);

}  // namespace numesh::models::detail
