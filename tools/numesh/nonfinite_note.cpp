#include "nonfinite_note.hpp"

#include <fmt/format.h>

#include <ostream>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::tools {

void note_nonfinite_weights(const std::vector<models::NonfiniteWeight>& found, bool refuse,
                            const std::string& where, std::ostream& out) {
  if (found.empty()) return;
  NUMESH_CHECK(!refuse, ValueError, "{}: {}{}; --refuse-nonfinite refuses it", where,
               found.front().describe(),
               found.size() > 1
                   ? fmt::format(" (and {} more weights hold NaN or infinities)", found.size() - 1)
                   : "");
  constexpr std::size_t kShown = 5;
  for (std::size_t i = 0; i < found.size() && i < kShown; ++i) {
    out << fmt::format("note: {}: {}\n", where, found[i].describe());
  }
  if (found.size() > kShown) {
    out << fmt::format("note: {}: and {} more weights hold NaN or infinities\n", where,
                       found.size() - kShown);
  }
}

}  // namespace numesh::tools
