#include "file_mapping.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <memory>
#include <utility>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "os_error.hpp"

namespace numesh::models::detail {

namespace {

constexpr std::size_t kHugePage = std::size_t{2} << 20;

// Maps `size` bytes of `fd` read-only and private at a multiple of 2 MiB: address space for
// size + 2 MiB is reserved, the file mapped over its first aligned byte, and the rest given
// back. MAP_FAILED when the OS refuses.
void* map_aligned(int fd, std::size_t size) {
  void* reserved = ::mmap(nullptr, size + kHugePage, PROT_NONE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserved == MAP_FAILED) return MAP_FAILED;
  const auto start = reinterpret_cast<std::uintptr_t>(reserved);
  const std::uintptr_t aligned = (start + kHugePage - 1) & ~(std::uintptr_t{kHugePage} - 1);
  void* address =
      ::mmap(reinterpret_cast<void*>(aligned), size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
  if (address == MAP_FAILED) {
    const int error = errno;
    ::munmap(reserved, size + kHugePage);
    errno = error;
    return MAP_FAILED;
  }
  // The reservation's head and tail: from its start to the mapping, and from the mapping's last
  // page to the reservation's end.
  const std::uintptr_t page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const std::uintptr_t end = (aligned + size + page - 1) / page * page;
  if (aligned > start) ::munmap(reserved, aligned - start);
  if (start + size + kHugePage > end)
    ::munmap(reinterpret_cast<void*>(end), start + size + kHugePage - end);
  return address;
}

}  // namespace

ReadableFile::~ReadableFile() { ::close(fd_); }

void ReadableFile::read_at(std::uint64_t offset, std::span<std::byte> out,
                           std::string_view where) const {
  std::size_t done = 0;
  while (done < out.size()) {
    // Linux moves at most 0x7ffff000 bytes a call: the rest in the next.
    const ssize_t got =
        ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    NUMESH_CHECK(got >= 0, IoError, "{}: {}", where, os_error(errno));
    if (got == 0) {
      // The end came early: the file's size now (a read at or past the end says only that).
      struct stat status {};
      NUMESH_CHECK(::fstat(fd_, &status) == 0, IoError, "{}: {}", where, os_error(errno));
      throw IoError(fmt::format(
          "{}: the file ends at byte {}, before the {} bytes at offset {} (was it changed after "
          "it was opened?)",
          where, status.st_size, out.size(), offset));
    }
    done += static_cast<std::size_t>(got);
  }
}

FileMapping map_file(const std::filesystem::path& file, std::string_view where,
                     std::uint64_t min_bytes, std::string_view min_text) {
  errno = 0;
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  NUMESH_CHECK(fd >= 0, IoError, "{}: {}", where, os_error(errno));
  std::shared_ptr<const ReadableFile> opened;
  try {
    opened = std::make_shared<const ReadableFile>(fd);
  } catch (...) {
    ::close(fd);  // not yet the ReadableFile's to close
    throw;
  }
  struct stat status {};
  NUMESH_CHECK(::fstat(fd, &status) == 0, IoError, "{}: {}", where, os_error(errno));
  NUMESH_CHECK(!S_ISDIR(status.st_mode), IoError, "{}: it is a directory", where);
  NUMESH_CHECK(S_ISREG(status.st_mode), IoError, "{}: it is not a regular file", where);
  const auto size = static_cast<std::uint64_t>(status.st_size);
  NUMESH_CHECK(size >= min_bytes, IoError, "{}: file ends early: it has {} bytes, fewer than {}",
               where, size, min_text);
  errno = 0;
  const auto bytes = static_cast<std::size_t>(size);
  void* address = bytes >= kHugePage ? map_aligned(fd, bytes)
                                     : ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  NUMESH_CHECK(address != MAP_FAILED, IoError, "{}: cannot map it into memory ({})", where,
               os_error(errno));
  return {std::shared_ptr<const std::byte>(
              static_cast<const std::byte*>(address),
              [bytes](const std::byte* p) { ::munmap(const_cast<std::byte*>(p), bytes); }),
          size, std::move(opened)};
}

}  // namespace numesh::models::detail
