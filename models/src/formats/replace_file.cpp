#include "replace_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <system_error>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "os_error.hpp"

namespace numesh::models::detail {

namespace {

// The file a path names once its symlinks are followed (a Hugging Face cache's snapshot names
// its blob by a link: the blob is replaced and the link stays); the path itself when it cannot
// be resolved.
std::filesystem::path link_target(const std::filesystem::path& file) {
  std::error_code ec;
  std::filesystem::path target = std::filesystem::weakly_canonical(file, ec);
  return ec ? file : target;
}

// Flushes the file's bytes to the disk, so that the rename never makes an empty file visible
// after a crash.
void sync_file(const std::filesystem::path& file, std::string_view what,
               const std::filesystem::path& target) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  NUMESH_CHECK(fd >= 0, IoError, "{}: writing '{}' failed ({})", what, target.string(),
               os_error(errno));
  const int synced = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  NUMESH_CHECK(synced == 0, IoError, "{}: writing '{}' failed ({})", what, target.string(),
               os_error(error));
}

}  // namespace

void write_replacing(const std::filesystem::path& file, std::string_view what,
                     const std::function<void(std::ostream& out)>& write) {
  const std::filesystem::path target = link_target(file);
  std::filesystem::path temporary = target;
  temporary += fmt::format(".{}.partial", ::getpid());
  std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
  NUMESH_CHECK(out.is_open(), IoError, "{}: cannot write '{}'", what, file.string());
  try {
    write(out);
    out.close();
    NUMESH_CHECK(!out.fail(), IoError, "{}: writing '{}' failed", what, file.string());
    sync_file(temporary, what, file);
    std::error_code ec;
    // The file it replaces keeps its permissions (a new file takes the umask's).
    const std::filesystem::file_status old = std::filesystem::status(target, ec);
    if (!ec && std::filesystem::exists(old))
      std::filesystem::permissions(temporary, old.permissions(), ec);
    std::filesystem::rename(temporary, target, ec);
    NUMESH_CHECK(!ec, IoError, "{}: cannot rename '{}' to '{}': {}", what, temporary.string(),
                 target.string(), ec.message());
  } catch (...) {
    out.close();
    std::error_code ec;
    std::filesystem::remove(temporary, ec);  // no half-written file left behind
    throw;
  }
}

}  // namespace numesh::models::detail
