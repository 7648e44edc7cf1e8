#pragma once

// Memory that the other processes of the host can map: where a device allocates once its mesh
// spans ranks on one machine, so that a collective on another rank reads the device's buffers
// in place, as devices of one process do (docs/distributed.md, "Ranks of one host").

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "numesh/runtime/free_ranges.hpp"

namespace numesh::runtime {

/// Which file an arena is, as the kernel knows it (fstat's st_dev and st_ino): what a process
/// that maps another's arena by its descriptor number checks it opened.
struct FileIdentity {
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  friend bool operator==(const FileIdentity&, const FileIdentity&) = default;
};

/// A sparse region of `capacity()` bytes over an anonymous shared-memory file (memfd), mapped
/// once in this process and by any other process of the host that opens the file
/// (/proc/PID/fd/FD). Blocks are carved from it first fit, in whole pages; a released block's
/// pages go back to the OS (a hole punched in the file), so the arena holds only what its live
/// blocks touched. Pages are placed as anonymous memory's are (a NUMA binding of the block, or
/// first touch). Thread-safety: all methods are safe to call concurrently.
class SharedArena {
 public:
  /// A new arena of `capacity` bytes (rounded up to whole pages), its file named `name` (shown
  /// in /proc/PID/maps). Nothing is allocated until blocks are touched.
  /// Throws: ValueError for a capacity of 0; Error naming the system call (memfd_create,
  /// ftruncate, mmap) and the OS's message when the arena cannot be made.
  static std::shared_ptr<SharedArena> create(const std::string& name, std::size_t capacity);

  ~SharedArena();
  SharedArena(const SharedArena&) = delete;
  SharedArena& operator=(const SharedArena&) = delete;

  /// A block of `bytes` (> 0), page-aligned, or nullptr when no free range of the arena is that
  /// large. Its contents are unspecified (zeros when its pages were never used).
  std::byte* allocate(std::size_t bytes) noexcept;

  /// Gives back a block that allocate() returned, with the size asked for. Its pages are
  /// returned to the OS.
  void release(std::byte* block, std::size_t bytes) noexcept;

  /// The offset of `bytes` bytes at `p` from the arena's first byte when they lie inside it.
  [[nodiscard]] std::optional<std::size_t> offset_of(const void* p,
                                                     std::size_t bytes) const noexcept;

  /// The file descriptor of the arena's file (owned by the arena).
  [[nodiscard]] int fd() const noexcept { return fd_; }
  /// The identity of the arena's file.
  [[nodiscard]] FileIdentity identity() const noexcept { return identity_; }
  /// The arena's size in bytes.
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  /// The first byte of this process's mapping.
  [[nodiscard]] std::byte* base() const noexcept { return base_; }
  /// Bytes in live blocks (whole pages).
  [[nodiscard]] std::size_t used_bytes() const noexcept;

 private:
  SharedArena(int fd, std::byte* base, std::size_t capacity, FileIdentity identity);

  int fd_;
  FileIdentity identity_;
  std::byte* base_;
  std::size_t capacity_;
  mutable std::mutex mutex_;
  FreeRanges ranges_;
};

/// A mapping of another process's SharedArena (or of one of this process's, at a second
/// address), made from the owner's process id and file descriptor. Unmapped when destroyed.
class ArenaMapping {
 public:
  /// Maps `capacity` bytes of process `pid`'s file descriptor `fd`, which must be the file
  /// `expected` of at least `capacity` bytes; read-only unless `writable`.
  /// Throws: Error naming the file and the OS's message when it cannot be opened or mapped
  /// (another user's process, a kernel that hides other processes' descriptors), or naming the
  /// file and what it is when it is another file or too small (the pid is another process's:
  /// ranks in separate PID namespaces that look like one host).
  ArenaMapping(int pid, int fd, std::size_t capacity, FileIdentity expected, bool writable);
  ~ArenaMapping();
  ArenaMapping(const ArenaMapping&) = delete;
  ArenaMapping& operator=(const ArenaMapping&) = delete;

  /// The first byte of the mapping.
  [[nodiscard]] std::byte* base() const noexcept { return base_; }
  /// Its size.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  std::byte* base_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace numesh::runtime
