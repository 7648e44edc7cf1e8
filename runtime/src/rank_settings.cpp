// Comparing the ranks' settings: each rank's list as JSON, its length all-gathered, then the
// lists themselves (padded to the longest), and one report that every rank computes alike.

#include "numesh/runtime/rank_settings.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>

#include "numesh/core/error.hpp"

namespace numesh::runtime {

void check_same_on_every_rank(Transport& transport, const std::vector<RankSetting>& settings) {
  const std::string mine = nlohmann::json(settings).dump();
  const auto ranks = static_cast<std::size_t>(transport.size());
  const auto length = static_cast<std::uint64_t>(mine.size());
  std::vector<std::uint64_t> lengths(ranks);
  transport.all_gather(std::as_bytes(std::span(&length, 1)),
                       std::as_writable_bytes(std::span(lengths)));
  const std::uint64_t longest = *std::max_element(lengths.begin(), lengths.end());
  std::vector<std::byte> padded(longest), all(longest * ranks);
  std::memcpy(padded.data(), mine.data(), mine.size());
  transport.all_gather(padded, all);

  // Each rank's settings by name; every rank reads the same bytes, so reports alike.
  std::vector<std::map<std::string, std::string>> by_rank(ranks);
  std::vector<std::string> names;  // in first-seen order over the ranks
  bool same = true;
  for (std::size_t r = 0; r < ranks; ++r) {
    const std::string text(reinterpret_cast<const char*>(all.data() + r * longest), lengths[r]);
    same = same && text == std::string(reinterpret_cast<const char*>(all.data()), lengths[0]);
    for (const auto& [name, value] : nlohmann::json::parse(text).get<std::vector<RankSetting>>()) {
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
      by_rank[r][name] = value;
    }
  }
  if (same) return;
  std::vector<std::string> differences;
  for (const std::string& name : names) {
    std::vector<std::optional<std::string>> values;
    for (const auto& settings_of_rank : by_rank) {
      const auto it = settings_of_rank.find(name);
      values.push_back(it == settings_of_rank.end() ? std::nullopt
                                                    : std::optional<std::string>(it->second));
    }
    if (std::all_of(values.begin(), values.end(), [&](const auto& v) { return v == values[0]; }))
      continue;
    std::vector<std::string> parts;
    for (std::size_t r = 0; r < ranks; ++r) {
      parts.push_back(values[r] ? fmt::format("rank {} '{}'", r, *values[r])
                                : fmt::format("rank {} (not given)", r));
    }
    differences.push_back(fmt::format("{}: {}", name, fmt::join(parts, ", ")));
  }
  if (differences.empty()) {
    // The same settings in another order: the order is part of what ranks must share.
    differences.push_back("the same settings in a different order");
  }
  throw ValueError(fmt::format("the ranks were started with different settings: {}",
                               fmt::join(differences, "; ")));
}

}  // namespace numesh::runtime
