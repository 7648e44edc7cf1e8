#include "numesh/sharding/rule_matching.hpp"

#include <fmt/format.h>

#include <cctype>
#include <cstdlib>
#include <regex>

#include "numesh/core/error.hpp"
#include "numesh/sharding/mesh_context.hpp"
#include "numesh/sharding/semantic_axis.hpp"

namespace numesh::sharding {

namespace {

// The length of the quantifier at pattern[i] (`*`, `+`, `?`, or Python's `{m}`, `{m,}`, `{,n}`,
// `{m,n}`, `{,}`), or 0 when there is none (a `{` that does not form one is a literal in Python).
std::size_t quantifier_length(const std::string& pattern, std::size_t i) {
  const char c = pattern[i];
  if (c == '*' || c == '+' || c == '?') return 1;
  if (c != '{') return 0;
  std::size_t j = i + 1;
  bool comma = false;
  for (; j < pattern.size() && pattern[j] != '}'; ++j) {
    if (pattern[j] == ',' && !comma) {
      comma = true;
    } else if (std::isdigit(static_cast<unsigned char>(pattern[j])) == 0) {
      return 0;
    }
  }
  // `{}` is a literal; `{,}` is Python's {0,} (sre_parse).
  return j < pattern.size() && j > i + 1 ? j - i + 1 : 0;
}

// The largest count numesh accepts in a `{m,n}` quantifier. Python accepts up to 2^32 - 1, but
// std::regex expands a counted repeat into that many states, and overflows a long reading a long
// count (found by rule_regex_fuzz under UBSan); a parameter path never needs more.
constexpr std::size_t kMaxRepeat = 65535;

// Refuses a `{m,n}` quantifier at pattern[i] (of length q) whose m or n exceeds kMaxRepeat.
void check_repeat_bounds(const std::string& pattern, std::size_t i, std::size_t q) {
  if (pattern[i] != '{') return;
  std::size_t count = 0;
  for (std::size_t k = i + 1; k < i + q - 1; ++k) {
    if (pattern[k] == ',') {
      count = 0;
      continue;
    }
    count = count * 10 + static_cast<std::size_t>(pattern[k] - '0');
    if (count > kMaxRepeat) {
      throw ValueError(fmt::format(
          "cannot compile partition rule pattern {}: the repetition number at position {} "
          "is larger than numesh's limit of {}",
          python_repr(pattern), i, kMaxRepeat));
    }
  }
}

// Translates the escape at pattern[i] (a backslash and a digit) as Python's sre_parse reads it,
// appending its ECMAScript form to `out`; returns the index of its last character. Octal
// escapes (`\0`, `\0d`, `\0dd`, three octal digits, and any octal digits in a class) become
// `\xHH`; outside a class one or two digits are a group reference, and a digit after them is a
// literal. std::regex would read a whole run of digits as one reference, and overflows a long
// on a long run (found by rule_regex_fuzz under UBSan).
std::size_t translate_numeric_escape(const std::string& pattern, std::size_t i, bool in_class,
                                     std::string& out) {
  const auto is_octal = [&](std::size_t k) {
    return k < pattern.size() && pattern[k] >= '0' && pattern[k] <= '7';
  };
  const auto is_digit = [&](std::size_t k) {
    return k < pattern.size() && std::isdigit(static_cast<unsigned char>(pattern[k])) != 0;
  };
  const std::size_t first = i + 1;
  std::size_t end = first;  // one past the escape's digits
  const bool octal = in_class ? is_octal(first)
                              : pattern[first] == '0' ||
                                    (is_octal(first) && is_octal(first + 1) && is_octal(first + 2));
  if (octal) {
    while (end < first + 3 && is_octal(end)) ++end;
    const int value = std::stoi(pattern.substr(first, end - first), nullptr, 8);
    if (value > 0377) {
      throw ValueError(fmt::format(
          "cannot compile partition rule pattern {}: octal escape value \\{} outside of "
          "range 0-0o377 at position {}",
          python_repr(pattern), pattern.substr(first, end - first), i));
    }
    out += fmt::format("\\x{:02x}", value);
    return end - 1;
  }
  if (in_class) {
    throw ValueError(
        fmt::format("cannot compile partition rule pattern {}: bad escape \\{} at position {}",
                    python_repr(pattern), pattern[first], i));
  }
  end = is_digit(first + 1) ? first + 2 : first + 1;
  out += '\\';
  out.append(pattern, first, end - first);
  if (is_digit(end)) out += "(?:)";  // the next digit is a literal, not part of the reference
  return end - 1;
}

// Translates the Python `re` syntax that has a direct ECMAScript equivalent and rejects the
// syntax that would otherwise be misread: `\A` -> `^`, `\Z` -> `$`, `(?P<name>` -> `(`, a
// leading `(?i)` -> icase, `{,n}` -> `{0,n}`, a brace outside a quantifier -> `\{` or `\}`;
// named back-references, lookbehind and other inline flags throw. A repeat of a repeat (`a+*`,
// `a**`, `a{2}+?*`) is refused as Python refuses it ("multiple repeat"): std::regex would
// accept it and backtrack exponentially on it (found by rule_regex_fuzz). Python 3.11's
// possessive quantifiers (`a*+`) have no ECMAScript equivalent.
// The longest name a pattern is matched against. libstdc++'s std::regex matches by recursion,
// a frame or more per character: a 50,000-character name overflowed the stack (found by
// review, from Python). Parameter paths are tens of characters; 4096 leaves room for any.
constexpr std::size_t kMaxMatchedName = 4096;

// std::regex_search of `name`, refused past kMaxMatchedName with a ValueError naming it.
bool search(const std::string& name, const std::regex& regex) {
  if (name.size() > kMaxMatchedName) {
    throw ValueError(
        fmt::format("the name '{}...' has {} characters; rules match names of at most {}",
                    name.substr(0, 40), name.size(), kMaxMatchedName));
  }
  return std::regex_search(name, regex);
}

std::regex compile_python_regex(const std::string& pattern) {
  auto unsupported = [&](std::string_view what) {
    return ValueError(
        fmt::format("cannot compile partition rule pattern {}: {} is Python-only "
                    "regex syntax that numesh does not support",
                    python_repr(pattern), what));
  };
  std::string out;
  auto flags = std::regex::ECMAScript;
  std::size_t i = 0;
  if (pattern.rfind("(?i)", 0) == 0) {
    flags |= std::regex::icase;
    i = 4;
  }
  bool in_class = false;
  bool quantified = false;  // the last token was a quantifier
  bool lazy = false;        // ... followed by its lazy `?`
  for (; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (!in_class) {
      if (const std::size_t q = quantifier_length(pattern, i); q > 0) {
        if (quantified) {
          if (c == '?' && !lazy) {
            lazy = true;
            out += c;
            continue;
          }
          if (c == '+' && !lazy) throw unsupported("a possessive quantifier");
          throw ValueError(fmt::format(
              "cannot compile partition rule pattern {}: multiple repeat at position {}",
              python_repr(pattern), i));
        }
        quantified = true;
        lazy = false;
        check_repeat_bounds(pattern, i, q);
        if (c == '{' && pattern[i + 1] == ',') {  // Python's `{,n}` is ECMAScript's `{0,n}`
          out += "{0";
          out.append(pattern, i + 1, q - 1);
        } else {
          out.append(pattern, i, q);
        }
        i += q - 1;
        continue;
      }
      quantified = false;
      lazy = false;
      // A brace that is not part of a quantifier is a literal in Python; std::regex refuses it.
      if (c == '{' || c == '}') {
        out += '\\';
        out += c;
        continue;
      }
    }
    if (c == '\\' && i + 1 < pattern.size()) {
      const char n = pattern[i + 1];
      if (std::isdigit(static_cast<unsigned char>(n)) != 0) {
        i = translate_numeric_escape(pattern, i, in_class, out);
        continue;
      }
      if (!in_class && n == 'A') {
        out += '^';
      } else if (!in_class && n == 'Z') {
        out += '$';
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (in_class) {
      if (c == ']') in_class = false;
      out += c;
      continue;
    }
    if (c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal in Python.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') {
        out += "\\]";
        ++i;
      }
      continue;
    }
    if (c == '(' && pattern.compare(i, 2, "(?") == 0 && i + 2 < pattern.size()) {
      const char k = pattern[i + 2];
      if (pattern.compare(i, 4, "(?P<") == 0) {
        const std::size_t close = pattern.find('>', i);
        if (close == std::string::npos) throw unsupported("an unterminated group name");
        out += '(';
        i = close;
        continue;
      }
      if (k == 'P') throw unsupported("(?P=name)");
      if (k == '<') throw unsupported("lookbehind");
      if (k == '#') throw unsupported("an inline comment");
      if (std::isalpha(static_cast<unsigned char>(k)) != 0) throw unsupported("an inline flag");
    }
    out += c;
  }
  try {
    return std::regex(out, flags);
  } catch (const std::regex_error& e) {
    throw ValueError(fmt::format("cannot compile partition rule pattern {}: {}",
                                 python_repr(pattern), e.what()));
  }
}

std::vector<std::regex> compile_all(const std::vector<PartitionRule>& rules) {
  std::vector<std::regex> out;
  out.reserve(rules.size());
  for (const PartitionRule& r : rules) out.push_back(compile_python_regex(r.pattern));
  return out;
}

// Python's int() on a decimal string: surrounding whitespace, an optional sign, digits with
// single underscores between them.
std::optional<std::int64_t> parse_python_int(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())) != 0) {
    text.remove_prefix(1);
  }
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())) != 0) {
    text.remove_suffix(1);
  }
  bool negative = false;
  if (!text.empty() && (text.front() == '+' || text.front() == '-')) {
    negative = text.front() == '-';
    text.remove_prefix(1);
  }
  if (text.empty()) return std::nullopt;
  std::int64_t value = 0;
  bool last_digit = false;
  for (char c : text) {
    if (c == '_' && last_digit) {
      last_digit = false;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c)) == 0) return std::nullopt;
    value = value * 10 + (c - '0');
    last_digit = true;
  }
  if (!last_digit) return std::nullopt;
  return negative ? -value : value;
}

}  // namespace

struct PatternPartitionSpec::Compiled {
  std::vector<std::regex> regexes;
};

std::int64_t min_sharding_size() {
  static const std::optional<std::int64_t> value = []() -> std::optional<std::int64_t> {
    const char* env = std::getenv("MIN_SHARDING_SIZE");  // NOLINT(concurrency-mt-unsafe)
    if (env == nullptr) return kMinShardingSize;
    return parse_python_int(env);
  }();
  if (!value) {
    const char* env = std::getenv("MIN_SHARDING_SIZE");  // NOLINT(concurrency-mt-unsafe)
    throw ValueError(fmt::format("invalid literal for int() with base 10: {}",
                                 python_repr(env != nullptr ? env : "")));
  }
  return *value;
}

std::vector<PartitionSpec> match_partition_rules(const std::vector<PartitionRule>& rules,
                                                 const std::vector<NamedLeaf>& leaves,
                                                 std::optional<std::int64_t> min_size,
                                                 bool strict) {
  const std::int64_t min = min_size ? *min_size : min_sharding_size();
  const std::vector<std::regex> regexes = compile_all(rules);
  std::vector<PartitionSpec> out;
  out.reserve(leaves.size());
  for (const NamedLeaf& leaf : leaves) {
    if (strict && (!leaf.array || leaf.array->shape.empty())) {
      out.emplace_back();
      continue;
    }
    std::optional<PartitionSpec> found;
    for (std::size_t r = 0; r < rules.size() && !found; ++r) {
      if (!search(leaf.path, regexes[r])) continue;
      const PartitionSpec& ps = rules[r].spec;
      if (!strict) {
        found = ps;
      } else if (leaf.array->size() < min) {
        found = PartitionSpec();
      } else if (ps.size() > leaf.array->shape.size()) {
        found = PartitionSpec(std::vector<AxisRule>(
            ps.begin(), ps.begin() + static_cast<std::ptrdiff_t>(leaf.array->shape.size())));
      } else {
        found = ps;
      }
    }
    if (!found) throw ValueError("Partition rule not found for param: " + leaf.path);
    out.push_back(std::move(*found));
  }
  return out;
}

PatternPartitionSpec::PatternPartitionSpec(std::vector<PartitionRule> rules,
                                           PartitionSpec default_spec)
    : rules_(std::move(rules)),
      default_spec_(std::move(default_spec)),
      compiled_(std::make_shared<const Compiled>(Compiled{compile_all(rules_)})) {}

PartitionSpec PatternPartitionSpec::operator()(std::string_view name) const {
  const std::string text(name);
  for (std::size_t r = 0; r < rules_.size(); ++r) {
    if (search(text, compiled_->regexes[r])) return rules_[r].spec;
  }
  return default_spec_;
}

PatternPartitionSpec create_pattern_based_partition_spec(
    std::string_view pattern, const Mesh* mesh, std::optional<PartitionSpec> default_spec) {
  if (mesh == nullptr && current_mesh().empty()) {
    throw NoMeshError("No mesh found under this context manager.");
  }
  // Python's str.split(sep): every occurrence, empty pieces kept.
  auto split = [](std::string_view text, std::string_view sep) {
    std::vector<std::string> parts;
    std::size_t start = 0;
    for (std::size_t pos; (pos = text.find(sep, start)) != std::string_view::npos;
         start = pos + sep.size()) {
      parts.emplace_back(text.substr(start, pos - start));
    }
    parts.emplace_back(text.substr(start));
    return parts;
  };
  std::vector<PartitionRule> rules;
  for (const std::string& piece : split(pattern, ",")) {
    if (piece.find("->") == std::string::npos) continue;
    const std::vector<std::string> sides = split(piece, "->");
    if (sides.size() > 2) throw ValueError("too many values to unpack (expected 2)");
    std::vector<AxisRule> entries;
    for (const std::string& axis : split(sides[1], ".")) entries.emplace_back(axis);
    const PartitionSpec spec(std::move(entries));  // "" canonicalises to None
    for (const std::string& regex : split(sides[0], "|")) rules.push_back({regex, spec});
  }
  return PatternPartitionSpec(std::move(rules),
                              default_spec ? std::move(*default_spec) : PartitionSpec());
}

}  // namespace numesh::sharding
