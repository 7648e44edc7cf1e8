#pragma once

// What every numesh fuzz target shares (docs/reliability.md, "Fuzzing").
//
// A target feeds libFuzzer's bytes to one of numesh's parsers. The contract it checks is the
// one every parser documents: bad input gets a numesh::Error that says what is wrong. Such an
// error is caught here and is not a finding. Everything else escapes to libFuzzer and is one:
// another exception type (a json::exception, std::out_of_range, std::bad_alloc...), a crash, a
// sanitizer report (the targets are built with ASan and UBSan), an allocation above
// libFuzzer's -malloc_limit_mb, or a run longer than its -timeout.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

#include "numesh/core/error.hpp"

namespace numesh::fuzz {

/// Runs `parse`, catching only numesh::Error (the clear error bad input must get).
template <class Parse>
void expect_clear_error_only(Parse&& parse) {
  try {
    parse();
  } catch (const numesh::Error&) {
    // The documented answer to bad input.
  }
}

/// The fuzzer's bytes as text (parsers take UTF-8 or ASCII text as bytes).
inline std::string_view as_text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

/// A directory of this process's own under the system's temporary directory, removed when
/// the process exits: parsers that read files (npy, safetensors, config.json, hwloc XML) are
/// fed through it.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  /// The directory.
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

  /// Writes exactly `bytes` to the file `name` in the directory (replacing it) and returns
  /// its path. Aborts when the file cannot be written: that is the harness failing, not numesh.
  std::filesystem::path write(std::string_view name, std::span<const std::uint8_t> bytes) const;

 private:
  std::filesystem::path path_;
};

/// The process's scratch directory (created on first use).
const ScratchDir& scratch();

}  // namespace numesh::fuzz
