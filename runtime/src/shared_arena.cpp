#include "numesh/runtime/shared_arena.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::runtime {

namespace {

std::size_t page_size() {
  static const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

std::size_t round_up(std::size_t bytes, std::size_t unit) {
  return (bytes + unit - 1) / unit * unit;
}

std::string os_message() { return std::error_code(errno, std::generic_category()).message(); }

}  // namespace

std::shared_ptr<SharedArena> SharedArena::create(const std::string& name, std::size_t capacity) {
  NUMESH_CHECK(capacity > 0, ValueError, "shared arena '{}': a capacity of 0 bytes", name);
  capacity = round_up(capacity, page_size());
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0)
    throw Error(fmt::format("shared arena '{}': memfd_create failed: {}", name, os_message()));
  if (ftruncate(fd, static_cast<off_t>(capacity)) != 0) {
    const std::string why = os_message();
    close(fd);
    throw Error(
        fmt::format("shared arena '{}': ftruncate to {} bytes failed: {}", name, capacity, why));
  }
  // NORESERVE: the arena is sparse; only touched pages take memory.
  void* base = mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (base == MAP_FAILED) {
    const std::string why = os_message();
    close(fd);
    throw Error(fmt::format("shared arena '{}': mmap of {} bytes failed: {}", name, capacity, why));
  }
  struct stat st {};
  fstat(fd, &st);
  const FileIdentity identity{static_cast<std::uint64_t>(st.st_dev),
                              static_cast<std::uint64_t>(st.st_ino)};
  return std::shared_ptr<SharedArena>(
      new SharedArena(fd, static_cast<std::byte*>(base), capacity, identity));
}

SharedArena::SharedArena(int fd, std::byte* base, std::size_t capacity, FileIdentity identity)
    : fd_(fd), identity_(identity), base_(base), capacity_(capacity), ranges_(capacity) {}

SharedArena::~SharedArena() {
  munmap(base_, capacity_);
  close(fd_);
}

std::byte* SharedArena::allocate(std::size_t bytes) noexcept {
  if (bytes == 0 || bytes > capacity_) return nullptr;
  const std::size_t size = round_up(bytes, page_size());
  const std::lock_guard lock(mutex_);
  const std::optional<std::size_t> offset = ranges_.take(size, page_size());
  return offset ? base_ + *offset : nullptr;
}

void SharedArena::release(std::byte* block, std::size_t bytes) noexcept {
  if (block == nullptr || bytes == 0) return;
  const auto offset = static_cast<std::size_t>(block - base_);
  const std::size_t size = round_up(bytes, page_size());
  // The pages go back to the OS (and read as zeros when used again); other processes' mappings
  // see the hole too, which is right: nobody may read a released block.
  (void)fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                  static_cast<off_t>(size));
  const std::lock_guard lock(mutex_);
  ranges_.give(offset, size);
}

std::optional<std::size_t> SharedArena::offset_of(const void* p, std::size_t bytes) const noexcept {
  const auto* b = static_cast<const std::byte*>(p);
  if (b < base_ || b >= base_ + capacity_) return std::nullopt;
  const auto offset = static_cast<std::size_t>(b - base_);
  if (bytes > capacity_ - offset) return std::nullopt;
  return offset;
}

std::size_t SharedArena::used_bytes() const noexcept {
  const std::lock_guard lock(mutex_);
  return ranges_.used();
}

ArenaMapping::ArenaMapping(int pid, int fd, std::size_t capacity, FileIdentity expected,
                           bool writable)
    : size_(capacity) {
  const std::string path = fmt::format("/proc/{}/fd/{}", pid, fd);
  const int own = open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (own < 0) throw Error(fmt::format("shared memory: cannot open {}: {}", path, os_message()));
  struct stat st {};
  if (fstat(own, &st) != 0 || static_cast<std::uint64_t>(st.st_dev) != expected.device ||
      static_cast<std::uint64_t>(st.st_ino) != expected.inode ||
      static_cast<std::uint64_t>(st.st_size) < capacity) {
    close(own);
    throw Error(fmt::format(
        "shared memory: {} is not the arena expected (file {}:{} of {} bytes, expected {}:{} of "
        "{} bytes or more): process {} is another process here (another PID namespace?)",
        path, st.st_dev, st.st_ino, st.st_size, expected.device, expected.inode, capacity, pid));
  }
  void* base = mmap(nullptr, capacity, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                    MAP_SHARED | MAP_NORESERVE, own, 0);
  const std::string why = base == MAP_FAILED ? os_message() : "";
  close(own);  // the mapping keeps the file
  if (base == MAP_FAILED)
    throw Error(fmt::format("shared memory: cannot map {} bytes of {}: {}", capacity, path, why));
  base_ = static_cast<std::byte*>(base);
}

ArenaMapping::~ArenaMapping() {
  if (base_ != nullptr) munmap(base_, size_);
}

}  // namespace numesh::runtime
