#include "replace_file.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <fstream>
#include <system_error>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::models::detail {

void write_replacing(const std::filesystem::path& file, std::string_view what,
                     const std::function<void(std::ostream& out)>& write) {
  std::filesystem::path temporary = file;
  temporary += fmt::format(".{}.partial", ::getpid());
  std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
  NUMESH_CHECK(out.is_open(), IoError, "{}: cannot write '{}'", what, file.string());
  try {
    write(out);
    out.close();
    NUMESH_CHECK(!out.fail(), IoError, "{}: writing '{}' failed", what, file.string());
    std::error_code ec;
    std::filesystem::rename(temporary, file, ec);
    NUMESH_CHECK(!ec, IoError, "{}: cannot rename '{}' to '{}': {}", what, temporary.string(),
                 file.string(), ec.message());
  } catch (...) {
    out.close();
    std::error_code ec;
    std::filesystem::remove(temporary, ec);  // no half-written file left behind
    throw;
  }
}

}  // namespace numesh::models::detail
