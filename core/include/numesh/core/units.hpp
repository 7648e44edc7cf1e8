#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <iterator>
#include <string>

namespace numesh {

/// "512 B", "1.5 KiB", "64.0 MiB": bytes in binary units with one decimal, for plans, tables
/// and progress lines.
inline std::string human_bytes(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  auto v = static_cast<double>(bytes);
  std::size_t u = 0;
  while (v >= 1024.0 && u + 1 < std::size(kUnits)) {
    v /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, kUnits[u]);
}

}  // namespace numesh
