#include "closest_names.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

namespace numesh::models::detail {
namespace {

/// Levenshtein distance (insert, delete, substitute one byte), with one row of memory.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), std::size_t{0});
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string closest_names_hint(std::string_view wanted, std::span<const std::string> names,
                               std::size_t count) {
  if (names.empty()) return "; there are no tensors";
  std::vector<std::pair<std::size_t, std::size_t>> ranked;  // (distance, position in names)
  ranked.reserve(names.size());
  for (std::size_t i = 0; i < names.size(); ++i)
    ranked.emplace_back(edit_distance(wanted, names[i]), i);
  const std::size_t shown = std::min(count, ranked.size());
  std::partial_sort(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(shown),
                    ranked.end());
  if (shown == 1) return fmt::format("; the closest name is '{}'", names[ranked[0].second]);
  std::string hint = "; the closest names are ";
  for (std::size_t i = 0; i < shown; ++i) {
    if (i > 0) hint += i + 1 == shown ? " and " : ", ";
    hint += fmt::format("'{}'", names[ranked[i].second]);
  }
  return hint;
}

}  // namespace numesh::models::detail
