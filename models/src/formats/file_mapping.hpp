#pragma once

// PRIVATE to models/src: a model file opened and mapped whole, read-only, the first step of
// every memory-mapped format (safetensors, GGUF). The mapping is shared: the file object holds
// it, and so does every weight that reads its bytes in place (Checkpoint::box_in_place); it is
// unmapped when the last of them lets go. The file stays open too: a copy of a run of its bytes
// is read with pread() (ReadableFile). The caller validates what is in it.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string_view>

namespace numesh::models::detail {

/// A file open for reading, closed with the object: what a copying read takes its bytes from
/// (one descriptor per open model file, for as long as the file object or a copy of its
/// mapping lives). A copy read with pread() has the kernel copy from the page cache, where a
/// copy out of the mapping first maps each page it touches: a page-table entry a 4 KiB page
/// where the page cache holds the file in small folios (as ext4 does a file written in pieces of
/// every size and offset: numesh's own writers write whole 8 MiB chunks, replace_file.hpp), which
/// made a copy of the 109 M Llama's q4_0 file (61 MB) on two threads of a VM take 25.6-33.0 ms
/// against 12.5-15.9 ms read (docs/benchmarks.md, "Session 53").
class ReadableFile {
 public:
  /// Takes `fd` (open for reading) to close.
  explicit ReadableFile(int fd) noexcept : fd_(fd) {}
  ~ReadableFile();
  ReadableFile(const ReadableFile&) = delete;
  ReadableFile& operator=(const ReadableFile&) = delete;

  /// Reads out.size() bytes at byte `offset` of the file into `out`, from any number of threads
  /// at once. Throws: IoError "<where>: <the OS's error>" when the read fails; "<where>: the file
  /// ends at byte N, before the M bytes at offset O (was it changed after it was opened?)" when
  /// the file is shorter than that now (N its size now).
  void read_at(std::uint64_t offset, std::span<std::byte> out, std::string_view where) const;

 private:
  int fd_;
};

/// A mapped file: its first byte (unmapped when the last copy of the pointer goes), its size,
/// and the file kept open for copying reads.
struct FileMapping {
  std::shared_ptr<const std::byte> address;
  std::uint64_t size = 0;
  std::shared_ptr<const ReadableFile> file;
};

/// Opens `file` and maps all of it read-only and private (nothing can be written back through
/// the mapping), keeping it open for copying reads. A file of 2 MiB or more is mapped
/// at an address that is a multiple of 2 MiB, so that the kernel can map the page cache's large
/// folios whole (one fault and one TLB entry per 2 MiB for the weights read in place). `where`
/// starts every message; `min_bytes` is the least the format needs, `min_text` names it ("the 8 of
/// the header length"). Throws: IoError "<where>: <the OS's error>" when the file cannot be opened,
/// examined or mapped; "<where>: it is a directory" / "it is not a regular file"; "<where>: file
/// ends early: it has N bytes, fewer than <min_text>" when it has fewer than `min_bytes`.
FileMapping map_file(const std::filesystem::path& file, std::string_view where,
                     std::uint64_t min_bytes, std::string_view min_text);

}  // namespace numesh::models::detail
