#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>

namespace numesh::runtime::detail {

// A byte count for a message: GB or MB with one decimal, bytes below a megabyte.
inline std::string size_text(std::uint64_t bytes) {
  const auto b = static_cast<double>(bytes);
  if (b >= 1e9) return fmt::format("{:.1f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.1f} MB", b / 1e6);
  return fmt::format("{} bytes", bytes);
}

}  // namespace numesh::runtime::detail
