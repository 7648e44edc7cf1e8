#include "replace_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <ostream>
#include <streambuf>
#include <system_error>
#include <utility>

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

// A new file's bytes written in whole chunks of kChunkBytes at offsets that are multiples of it
// (the last one shorter): the kernel then caches the file in folios of 2 MiB, its largest, which
// a reader maps whole (file_mapping.hpp) and reads at memory speed. std::ofstream writes any
// piece of 1 KiB or more as it comes, at whatever offset the pieces before left, and ext4
// caches such a file in folios of every size down to 4 KiB: the 109 M Llama's q8_0 GGUF file
// written that way read in 6.4-20 ms and mapped in 21-23 ms, the same bytes written in chunks in
// 4.7-5.7 ms and 1.8-3.4 ms (docs/benchmarks.md, "Session 55"). A flush of the stream writes
// nothing (it would leave the chunks after it off their offsets): finish() writes the last one.
class ChunkedFileBuf final : public std::streambuf {
 public:
  static constexpr std::streamsize kChunkBytes = std::streamsize{8} << 20;

  /// Writes to `fd` (open for writing, at offset 0), which the caller closes.
  explicit ChunkedFileBuf(int fd)
      : fd_(fd), buffer_(std::make_unique_for_overwrite<char[]>(kChunkBytes)) {
    setp(buffer_.get(), buffer_.get() + kChunkBytes);
  }

  /// Writes what is buffered, the file's last chunk. False when a write failed (error()).
  [[nodiscard]] bool finish() { return write_buffered(); }

  /// The errno of the write that failed; 0 while none has.
  [[nodiscard]] int error() const noexcept { return error_; }

 protected:
  int_type overflow(int_type c) override {
    if (!write_buffered()) return traits_type::eof();
    if (!traits_type::eq_int_type(c, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(c);
      pbump(1);
    }
    return traits_type::not_eof(c);
  }

  std::streamsize xsputn(const char* s, std::streamsize n) override {
    std::streamsize done = 0;
    while (done < n) {
      if (pptr() == pbase() && n - done >= kChunkBytes) {
        // A whole chunk straight from the caller's bytes: nothing is buffered, so the file's
        // offset is a multiple of a chunk (one write() a chunk: Linux writes at most 2 GiB a
        // call, which would leave the rest off a chunk's offset).
        if (!write_all(s + done, kChunkBytes)) return done;
        done += kChunkBytes;
        continue;
      }
      const std::streamsize take = std::min<std::streamsize>(epptr() - pptr(), n - done);
      std::memcpy(pptr(), s + done, static_cast<std::size_t>(take));
      pbump(static_cast<int>(take));  // at most a chunk
      done += take;
      if (pptr() == epptr() && !write_buffered()) return done;
    }
    return done;
  }

  int sync() override { return error_ == 0 ? 0 : -1; }  // finish() writes the last chunk

 private:
  bool write_buffered() {
    const std::streamsize n = pptr() - pbase();
    if (n > 0 && !write_all(pbase(), n)) return false;
    setp(buffer_.get(), buffer_.get() + kChunkBytes);
    return true;
  }

  bool write_all(const char* p, std::streamsize n) {
    while (n > 0 && error_ == 0) {
      const ssize_t wrote = ::write(fd_, p, static_cast<std::size_t>(n));
      if (wrote < 0 && errno == EINTR) continue;
      if (wrote <= 0) {
        error_ = wrote < 0 ? errno : EIO;
        break;
      }
      p += wrote;
      n -= wrote;
    }
    return error_ == 0;
  }

  int fd_;
  std::unique_ptr<char[]> buffer_;
  int error_ = 0;
};

// Closes a descriptor with the scope, unless close() took it first (its error is wanted).
struct ClosingFd {
  int fd;
  ~ClosingFd() {
    if (fd >= 0) ::close(fd);
  }
  int close() { return ::close(std::exchange(fd, -1)); }
};

}  // namespace

void write_replacing(const std::filesystem::path& file, std::string_view what,
                     const std::function<void(std::ostream& out)>& write) {
  const std::filesystem::path target = link_target(file);
  std::filesystem::path temporary = target;
  temporary += fmt::format(".{}.partial", ::getpid());
  ClosingFd fd{::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666)};
  NUMESH_CHECK(fd.fd >= 0, IoError, "{}: cannot write '{}'", what, file.string());
  try {
    {
      ChunkedFileBuf buffer(fd.fd);
      std::ostream out(&buffer);
      write(out);
      const bool written = !out.fail() && buffer.finish();
      // A stream's failure with no OS error (a failed output of `write`'s own) has no reason.
      NUMESH_CHECK(written, IoError, "{}: writing '{}' failed{}", what, file.string(),
                   buffer.error() != 0 ? fmt::format(" ({})", os_error(buffer.error())) : "");
    }
    // On the disk before the rename, so that a crash never leaves an empty file in its place.
    const int synced = ::fsync(fd.fd) == 0 ? 0 : errno;
    NUMESH_CHECK(synced == 0, IoError, "{}: writing '{}' failed ({})", what, file.string(),
                 os_error(synced));
    const int closed = fd.close() == 0 ? 0 : errno;
    NUMESH_CHECK(closed == 0, IoError, "{}: writing '{}' failed ({})", what, file.string(),
                 os_error(closed));
    std::error_code ec;
    // The file it replaces keeps its permissions (a new file takes the umask's).
    const std::filesystem::file_status old = std::filesystem::status(target, ec);
    if (!ec && std::filesystem::exists(old))
      std::filesystem::permissions(temporary, old.permissions(), ec);
    std::filesystem::rename(temporary, target, ec);
    NUMESH_CHECK(!ec, IoError, "{}: cannot rename '{}' to '{}': {}", what, temporary.string(),
                 target.string(), ec.message());
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(temporary, ec);  // no half-written file left behind
    throw;
  }
}

}  // namespace numesh::models::detail
