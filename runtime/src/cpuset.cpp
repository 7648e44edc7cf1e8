#include "numesh/runtime/cpuset.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <iterator>
#include <system_error>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::runtime {

namespace {

// Linux's CONFIG_NR_CPUS tops out at 8192; the limit keeps a typo such as "0-4000000000" from
// allocating gigabytes here or in hwloc's bitmaps.
constexpr int kMaxPu = 65535;

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Where a parse error happened: the rest of the text, or "the end".
std::string at(std::string_view rest) {
  return rest.empty() ? std::string("the end") : fmt::format("'{}'", rest);
}

// Reads one non-negative PU number from the front of `rest` and advances past it.
int read_number(std::string_view text, std::string_view& rest) {
  NUMESH_CHECK(rest.empty() || rest.front() != '-', ValueError,
               "bad cpuset '{}': negative number at {}", text, at(rest));
  NUMESH_CHECK(!rest.empty() && is_digit(rest.front()), ValueError,
               "bad cpuset '{}': expected a number at {}", text, at(rest));
  int value = 0;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), value);
  NUMESH_CHECK(ec == std::errc() && value <= kMaxPu, ValueError,
               "bad cpuset '{}': number at {} is above the limit {}", text, at(rest), kMaxPu);
  rest.remove_prefix(static_cast<std::size_t>(end - rest.data()));
  return value;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

CpuSet::CpuSet(std::vector<int> pus) : pus_(std::move(pus)) {
  std::sort(pus_.begin(), pus_.end());
  pus_.erase(std::unique(pus_.begin(), pus_.end()), pus_.end());
  if (!pus_.empty()) {
    NUMESH_CHECK(pus_.front() >= 0, ValueError, "cpuset PU index {} is negative", pus_.front());
    NUMESH_CHECK(pus_.back() <= kMaxPu, ValueError, "cpuset PU index {} is above the limit {}",
                 pus_.back(), kMaxPu);
  }
}

CpuSet CpuSet::parse(std::string_view text) {
  const std::string_view body = trim(text);
  if (body.empty() || body == "none") return CpuSet();
  std::vector<int> pus;
  std::string_view rest = body;
  while (true) {
    const int first = read_number(text, rest);
    int last = first;
    if (!rest.empty() && rest.front() == '-') {
      rest.remove_prefix(1);
      last = read_number(text, rest);
      NUMESH_CHECK(first <= last, ValueError, "bad cpuset '{}': range {}-{} is reversed", text,
                   first, last);
    }
    for (int pu = first; pu <= last; ++pu) pus.push_back(pu);
    if (rest.empty()) break;
    NUMESH_CHECK(rest.front() == ',', ValueError,
                 "bad cpuset '{}': unexpected character '{}' at {}", text, rest.front(), at(rest));
    rest.remove_prefix(1);
  }
  return CpuSet(std::move(pus));
}

bool CpuSet::contains(int pu) const noexcept {
  return std::binary_search(pus_.begin(), pus_.end(), pu);
}

bool CpuSet::contains(const CpuSet& other) const noexcept {
  return std::includes(pus_.begin(), pus_.end(), other.pus_.begin(), other.pus_.end());
}

CpuSet CpuSet::intersect(const CpuSet& other) const {
  CpuSet out;
  std::set_intersection(pus_.begin(), pus_.end(), other.pus_.begin(), other.pus_.end(),
                        std::back_inserter(out.pus_));
  return out;
}

CpuSet CpuSet::unite(const CpuSet& other) const {
  CpuSet out;
  std::set_union(pus_.begin(), pus_.end(), other.pus_.begin(), other.pus_.end(),
                 std::back_inserter(out.pus_));
  return out;
}

bool CpuSet::intersects(const CpuSet& other) const noexcept {
  auto a = pus_.begin();
  auto b = other.pus_.begin();
  while (a != pus_.end() && b != other.pus_.end()) {
    if (*a == *b) return true;
    if (*a < *b) {
      ++a;
    } else {
      ++b;
    }
  }
  return false;
}

std::string CpuSet::to_string() const {
  std::string out;
  std::size_t i = 0;
  while (i < pus_.size()) {
    std::size_t j = i;
    while (j + 1 < pus_.size() && pus_[j + 1] == pus_[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? fmt::format("{}", pus_[i]) : fmt::format("{}-{}", pus_[i], pus_[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace numesh::runtime
