#include "parsers.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <limits>
#include <optional>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/units.hpp"

namespace numesh::tools {

using json = nlohmann::json;

namespace {

using sharding::AxisRule;

AxisRule parse_name(std::string_view s) {
  if (is_none_word(s)) return AxisRule();
  return AxisRule(sharding::normalize_token(s));
}

}  // namespace

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split_list(std::string_view text) {
  std::vector<std::string_view> out;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '(' || c == '[') ++depth;
    if (c == ')' || c == ']') --depth;
    if (c == ',' && depth == 0) {
      out.push_back(trim(text.substr(start, i - start)));
      start = i + 1;
    }
  }
  out.push_back(trim(text.substr(start)));
  return out;
}

std::vector<std::string> parse_names(std::string_view text) {
  std::vector<std::string> out;
  for (std::string_view n : split_list(text)) out.emplace_back(n);
  return out;
}

std::vector<std::string> parse_items(std::string_view text) {
  std::vector<std::string> out;
  for (std::string_view item : split_list(text)) {
    if (!item.empty()) out.emplace_back(item);
  }
  return out;
}

std::vector<std::int64_t> parse_int_list(std::string_view text, std::string_view what) {
  std::vector<std::int64_t> out;
  for (std::string_view item : split_list(text)) {
    std::int64_t v = 0;
    const auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || ptr != item.data() + item.size()) {
      throw ValueError(fmt::format("{} '{}': '{}' is not an integer", what, text, item));
    }
    out.push_back(v);
  }
  return out;
}

std::vector<std::int32_t> parse_token_ids(std::string_view text, std::string_view what) {
  std::vector<std::int32_t> ids;
  for (std::int64_t id : parse_int_list(text, what)) {
    NUMESH_CHECK(id >= 0 && id <= std::numeric_limits<std::int32_t>::max(), ValueError,
                 "{} '{}': {} is not a token id", what, text, id);
    ids.push_back(static_cast<std::int32_t>(id));
  }
  NUMESH_CHECK(!ids.empty(), ValueError, "{} '{}' holds no token id", what, text);
  return ids;
}

std::vector<std::int64_t> parse_shape(std::string_view text, std::string_view what) {
  std::vector<std::int64_t> shape = parse_int_list(text, what);
  for (std::int64_t e : shape) {
    NUMESH_CHECK(e >= 0, ValueError, "{} '{}': extent {} is negative", what, text, e);
  }
  return shape;
}

std::size_t parse_bytes(std::string_view text) {
  constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();
  std::size_t i = 0, value = 0;
  bool overflow = false;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    const auto digit = static_cast<std::size_t>(text[i] - '0');
    overflow = overflow || value > (kMax - digit) / 10;
    value = value * 10 + digit;
    ++i;
  }
  NUMESH_CHECK(i > 0, ValueError, "bad size '{}': expected a number such as 4K, 64MiB or 4096",
               text);
  const std::string_view unit = text.substr(i);
  int shift = -1;
  if (unit.empty() || unit == "B") shift = 0;
  if (unit == "K" || unit == "KiB" || unit == "k") shift = 10;
  if (unit == "M" || unit == "MiB") shift = 20;
  if (unit == "G" || unit == "GiB") shift = 30;
  NUMESH_CHECK(shift >= 0, ValueError,
               "bad size '{}': unknown unit '{}' (use K, KiB, M, MiB, G or GiB)", text, unit);
  NUMESH_CHECK(!overflow && value <= (kMax >> shift), ValueError,
               "bad size '{}': too large for a byte count", text);
  return value << shift;
}

std::size_t parse_array_bytes(std::string_view option, std::string_view text, std::size_t max) {
  constexpr std::size_t kLine = 64;
  constexpr std::size_t kMinBytes = 4096;
  std::size_t bytes = 0;
  try {
    bytes = parse_bytes(text);
  } catch (const ValueError& e) {
    throw ValueError(fmt::format("{}: {}", option, e.what()));
  }
  NUMESH_CHECK(bytes % kLine == 0 && bytes >= kMinBytes && bytes <= max, ValueError,
               "{} '{}' is {} bytes; it must be a multiple of 64 bytes from {} to {}", option, text,
               bytes, human_bytes(kMinBytes), human_bytes(max));
  return bytes;
}

std::vector<diagnostics::MemoryKernel> parse_memory_kernels(std::string_view text) {
  std::vector<diagnostics::MemoryKernel> kernels;
  for (const std::string& item : parse_items(text)) {
    diagnostics::MemoryKernel k = diagnostics::MemoryKernel::kRead;
    try {
      k = diagnostics::parse_memory_kernel(item);
    } catch (const ValueError& e) {
      throw ValueError(fmt::format("--kernels '{}': {}", text, e.what()));
    }
    NUMESH_CHECK(std::find(kernels.begin(), kernels.end(), k) == kernels.end(), ValueError,
                 "--kernels '{}': '{}' is listed twice", text, item);
    kernels.push_back(k);
  }
  NUMESH_CHECK(!kernels.empty(), ValueError,
               "--kernels '{}' names no kernel (choose from read, copy, triad)", text);
  return kernels;
}

std::vector<int> parse_threads_sweep(std::string_view text) {
  std::vector<int> counts;
  for (const std::string& item : parse_items(text)) {
    int count = 0;
    if (item != "all") {
      const auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), count);
      NUMESH_CHECK(ec == std::errc() && ptr == item.data() + item.size(), ValueError,
                   "--threads-sweep '{}': '{}' is neither a thread count nor 'all'", text, item);
      NUMESH_CHECK(count > 0, ValueError,
                   "--threads-sweep '{}': {} is not a positive thread count ('all' means every "
                   "thread of a device)",
                   text, count);
    }
    NUMESH_CHECK(std::find(counts.begin(), counts.end(), count) == counts.end(), ValueError,
                 "--threads-sweep '{}': '{}' is listed twice", text, item);
    counts.push_back(count);
  }
  NUMESH_CHECK(!counts.empty(), ValueError,
               "--threads-sweep '{}' names no thread count (e.g. 1,2,4,all)", text);
  return counts;
}

runtime::PlacementPolicy parse_policy_option(std::string_view text) {
  runtime::PlacementPolicy policy = runtime::PlacementPolicy::kNuma;
  try {
    policy = runtime::parse_placement_policy(text);
  } catch (const ValueError&) {
    // The runtime's message lists `explicit` too, which the command line cannot take.
    throw ValueError(
        fmt::format("--policy '{}' is not a placement policy (choose numa, l3 or core)", text));
  }
  NUMESH_CHECK(policy != runtime::PlacementPolicy::kExplicit, ValueError,
               "--policy 'explicit' needs cpusets, which the command line does not take (choose "
               "numa, l3 or core)");
  return policy;
}

sharding::ModeArg parse_mode_arg(std::string_view text) {
  if (text.rfind("dim:", 0) == 0) {
    const auto n = parse_int_list(text.substr(4), "--mode dim:N");
    if (n.size() != 1) throw ValueError(fmt::format("--mode '{}': dim:N takes one integer", text));
    return sharding::ModeArg::from_dim(n.front());
  }
  if (const auto m = sharding::parse_mode(text)) return *m;
  throw ValueError(fmt::format(
      "--mode '{}' is not a mode (expected train, prefill, decode, insert or dim:N)", text));
}

sharding::ModeArg parse_run_mode(std::string_view text) {
  const std::optional<sharding::Mode> named = sharding::parse_mode(text);
  NUMESH_CHECK(text.rfind("dim:", 0) == 0 || (named && *named != sharding::Mode::kInsert),
               ValueError, "--mode '{}': expected train, prefill, decode or dim:N", text);
  return parse_mode_arg(text);
}

sharding::Mode parse_op_mode(std::string_view text) {
  return sharding::parse_named_mode(text, OptionStyle::kFlag);
}

ops::KvLayout parse_kv_layout(std::string_view text) {
  return ops::parse_kv_layout(text, OptionStyle::kFlag);
}

bool is_none_word(std::string_view s) {
  return s.empty() || s == "None" || s == "none" || s == "null";
}

std::vector<AxisRule> parse_axes(std::string_view text) {
  int depth = 0;
  for (char c : text) {
    if (c == '(' || c == '[') {
      if (++depth > 1) throw ValueError(fmt::format("--axes '{}': composites cannot nest", text));
    } else if (c == ')' || c == ']') {
      if (--depth < 0) throw ValueError(fmt::format("--axes '{}': unbalanced '{}'", text, c));
    }
  }
  if (depth != 0) throw ValueError(fmt::format("--axes '{}': unclosed bracket", text));
  std::vector<AxisRule> out;
  if (trim(text).empty()) return out;
  for (std::string_view entry : split_list(text)) {
    if (!entry.empty() && (entry.front() == '(' || entry.front() == '[')) {
      const char close = entry.front() == '(' ? ')' : ']';
      if (entry.back() != close) {
        throw ValueError(
            fmt::format("--axes '{}': entry '{}' has text after its bracket", text, entry));
      }
      std::vector<AxisRule> members;
      const std::string_view inner = trim(entry.substr(1, entry.size() - 2));
      if (!inner.empty()) {
        for (std::string_view m : split_list(inner)) members.push_back(parse_name(m));
      }
      out.push_back(AxisRule::list(std::move(members)));
    } else {
      out.push_back(parse_name(entry));
    }
  }
  return out;
}

json parse_set_value(std::string_view v) {
  v = trim(v);
  if (is_none_word(v)) return nullptr;
  if (v.front() == '(' || v.front() == '[') {
    const char close = v.front() == '(' ? ')' : ']';
    if (v.back() != close) {
      throw ValueError(fmt::format("--set value '{}' has an unclosed bracket", v));
    }
    json arr = json::array();
    const std::string_view inner = trim(v.substr(1, v.size() - 2));
    if (inner.empty()) return arr;
    for (std::string_view m : split_list(inner)) {
      if (m.find_first_of("()[]") != std::string_view::npos) {
        throw ValueError(fmt::format("--set value '{}' nests brackets", v));
      }
      arr.push_back(is_none_word(m) ? json(nullptr) : json(std::string(m)));
    }
    return arr;
  }
  return std::string(v);
}

std::pair<std::string, json> parse_field_set(std::string_view text) {
  const auto eq = text.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    throw ValueError(fmt::format("--set '{}' is not of the form field=value", text));
  }
  return {std::string(trim(text.substr(0, eq))), parse_set_value(text.substr(eq + 1))};
}

}  // namespace numesh::tools
