#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace numesh::runtime {

/// A set of processing units (PUs, hardware threads) named by their operating-system index, as
/// `taskset` and `/sys` name them. numesh's own type, so that no public header needs hwloc.
///
/// Text form is the Linux/hwloc list syntax: "0-3,8,10-11"; the empty set is "" (to_string)
/// and "none" is accepted by parse().
/// A regular value type. Thread-safety: const methods are safe to call concurrently.
class CpuSet {
 public:
  /// The empty set.
  CpuSet() = default;
  /// The set of the given indices (duplicates and order do not matter).
  /// Throws: ValueError when an index is negative or above 65535 (no machine has that many PUs;
  /// the limit keeps a typo from allocating gigabytes).
  explicit CpuSet(std::vector<int> pus);

  /// Parses list syntax ("0-3,8"); surrounding blanks are ignored, "" and "none" give the
  /// empty set. Throws: ValueError naming the text and the bad part (a negative number, a
  /// reversed range, a stray character, a number above 65535), e.g.
  /// "bad cpuset 'a-3': expected a number at 'a-3'".
  static CpuSet parse(std::string_view text);

  /// The indices, ascending.
  const std::vector<int>& pus() const noexcept { return pus_; }
  /// Number of PUs.
  std::size_t size() const noexcept { return pus_.size(); }
  /// True when the set has no PU.
  bool empty() const noexcept { return pus_.empty(); }
  /// True when `pu` is in the set.
  bool contains(int pu) const noexcept;
  /// True when every PU of `other` is in this set.
  bool contains(const CpuSet& other) const noexcept;
  /// The PUs in both sets.
  CpuSet intersect(const CpuSet& other) const;
  /// The PUs in either set.
  CpuSet unite(const CpuSet& other) const;
  /// True when the sets share a PU.
  bool intersects(const CpuSet& other) const noexcept;

  /// List syntax, e.g. "0-3,8"; "" for the empty set.
  std::string to_string() const;

  friend bool operator==(const CpuSet&, const CpuSet&) = default;

 private:
  std::vector<int> pus_;  // sorted, unique
};

}  // namespace numesh::runtime

/// Formats a CpuSet in list syntax.
template <>
struct fmt::formatter<numesh::runtime::CpuSet> : fmt::formatter<std::string> {
  auto format(const numesh::runtime::CpuSet& s, fmt::format_context& ctx) const {
    return fmt::formatter<std::string>::format(s.to_string(), ctx);
  }
};
