#include "file_mapping.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "os_error.hpp"

namespace numesh::models::detail {

namespace {

// Closes a file descriptor on scope exit: the mapping outlives it.
struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

}  // namespace

FileMapping map_file(const std::filesystem::path& file, std::string_view where,
                     std::uint64_t min_bytes, std::string_view min_text) {
  errno = 0;
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  NUMESH_CHECK(fd >= 0, IoError, "{}: {}", where, os_error(errno));
  const FdCloser closer{fd};
  struct stat status {};
  NUMESH_CHECK(::fstat(fd, &status) == 0, IoError, "{}: {}", where, os_error(errno));
  NUMESH_CHECK(!S_ISDIR(status.st_mode), IoError, "{}: it is a directory", where);
  NUMESH_CHECK(S_ISREG(status.st_mode), IoError, "{}: it is not a regular file", where);
  const auto size = static_cast<std::uint64_t>(status.st_size);
  NUMESH_CHECK(size >= min_bytes, IoError, "{}: file ends early: it has {} bytes, fewer than {}",
               where, size, min_text);
  errno = 0;
  void* address = ::mmap(nullptr, static_cast<std::size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
  NUMESH_CHECK(address != MAP_FAILED, IoError, "{}: cannot map it into memory ({})", where,
               os_error(errno));
  return {static_cast<const std::byte*>(address), size};
}

}  // namespace numesh::models::detail
