#pragma once
// The kernel's view of a mapping's huge pages, for the tests of numesh's huge-page requests.

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

namespace numesh::runtime::testing {

/// The kernel's flag for the mapping that holds `address`: smaps' "THPeligible" line (1 when a
/// huge page may back it: madvise(MADV_HUGEPAGE) under the "madvise" setting, or "always");
/// nullopt when no mapping holds it.
inline std::optional<int> thp_eligible(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(' ') > line.find('-')) {
      inside = at >= lo && at < hi;
    } else if (inside && line.rfind("THPeligible:", 0) == 0) {
      return std::stoi(line.substr(12));
    }
  }
  return std::nullopt;
}

/// The kernel's transparent huge page setting's chosen word ("always", "madvise", "never"), or
/// "" when it has none.
inline std::string thp_setting() {
  std::ifstream setting("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(setting, mode);
  const auto open = mode.find('['), close = mode.find(']');
  return open == std::string::npos || close == std::string::npos
             ? ""
             : mode.substr(open + 1, close - open - 1);
}

}  // namespace numesh::runtime::testing
