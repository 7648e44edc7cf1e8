#include "compat_doc.hpp"

#include <fmt/format.h>

#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <string_view>

namespace numesh::conformance {

namespace {

constexpr std::string_view kSection = "Vector cases that differ";
constexpr std::string_view kKindsSection = "Calls that cannot be written in C++";
constexpr std::string_view kReturns = "  - numesh returns: ";
constexpr std::string_view kNotEvaluated = "  - numesh: not evaluated (";
constexpr std::string_view kOnlyAt = "  - differs from eformer's only at: ";

bool starts_with(const std::string& s, std::string_view prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// "`/a`, `/b/c`" -> the pointers; anything else in the text is an error (so a typo cannot
// silently widen or narrow what the runner checks).
std::vector<json::json_pointer> parse_pointers(const std::string& text, const std::string& where) {
  std::vector<json::json_pointer> out;
  std::size_t pos = 0;
  while (true) {
    const std::size_t close = text.size() > pos + 1 ? text.find('`', pos + 1) : std::string::npos;
    if (text.compare(pos, 1, "`") != 0 || close == std::string::npos) {
      throw CompatDocError(
          fmt::format("{}: expected a list of JSON Pointers in backticks (`/a`, `/b/c`), got '{}'",
                      where, text));
    }
    const std::string pointer = text.substr(pos + 1, close - pos - 1);
    try {
      out.emplace_back(pointer);
    } catch (const json::exception& e) {
      throw CompatDocError(
          fmt::format("{}: '{}' is not a JSON Pointer: {}", where, pointer, e.what()));
    }
    if (pointer.empty()) {
      throw CompatDocError(
          fmt::format("{}: the empty pointer would exempt the whole value", where));
    }
    pos = close + 1;
    if (pos == text.size()) return out;
    if (text.compare(pos, 2, ", ") != 0) {
      throw CompatDocError(fmt::format("{}: expected ', ' between pointers in '{}'", where, text));
    }
    pos += 2;
  }
}

// Calls f(line, where) for every line of `doc` under its "## " heading containing `section`
// (until the next "## "), fenced code blocks left out; `where` is "doc:line". Returns whether
// the section was found.
// Throws: CompatDocError when doc cannot be read; what f throws.
bool for_each_section_line(
    const std::filesystem::path& doc, std::string_view section,
    const std::function<void(const std::string& line, int n, const std::string& where)>& f) {
  std::ifstream in(doc);
  if (!in) throw CompatDocError("cannot read " + doc.string());
  bool in_section = false, found = false;
  bool in_fence = false;  // a fenced code block (the format's example) holds no items
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (starts_with(line, "```")) in_fence = !in_fence;
    if (in_fence || starts_with(line, "```")) continue;
    if (starts_with(line, "## ")) {
      in_section = line.find(section) != std::string::npos;
      found = found || in_section;
      continue;
    }
    if (in_section) f(line, n, fmt::format("{}:{}", doc.string(), n));
  }
  return found;
}

}  // namespace

std::vector<DocumentedDivergence> load_documented_divergences(const std::filesystem::path& doc) {
  static const std::regex item(R"(^- `([^`:]+\.json):([^`]+)`: (.+)$)");
  std::vector<DocumentedDivergence> out;
  std::map<std::string, int> item_lines;
  const bool found_section = for_each_section_line(
      doc, kSection, [&](const std::string& line, int n, const std::string& where) {
        if (starts_with(line, "- ")) {
          std::smatch m;
          if (!std::regex_match(line, m, item)) {
            throw CompatDocError(fmt::format(
                "{}: not an item of the form \"- `file.json:case-id`: reason\": {}", where, line));
          }
          DocumentedDivergence d{m[1], m[2], m[3], n, std::nullopt, std::nullopt, {}};
          if (d.id.find('*') != std::string::npos) {
            // A pattern exempts cases whose values nobody states, so nothing checks them.
            throw CompatDocError(fmt::format(
                "{}: `{}`: wildcards are not supported; list each case with the value numesh "
                "returns",
                where, d.key()));
          }
          if (auto [it, fresh] = item_lines.emplace(d.key(), n); !fresh) {
            throw CompatDocError(
                fmt::format("{}: `{}` is already listed on line {}", where, d.key(), it->second));
          }
          out.push_back(std::move(d));
          return;
        }
        if (!starts_with(line, "  - ")) return;  // prose, comments, blank lines

        if (out.empty()) {
          throw CompatDocError(
              fmt::format("{}: a sub-item before the first item: {}", where, line));
        }
        DocumentedDivergence& d = out.back();
        const bool is_returns = starts_with(line, kReturns);
        const bool is_not_evaluated = starts_with(line, kNotEvaluated);
        if ((is_returns || is_not_evaluated) && d.has_statement()) {
          throw CompatDocError(fmt::format(
              "{}: `{}` already states numesh's result (one statement per item)", where, d.key()));
        }
        if (is_returns) {
          const std::string value = line.substr(kReturns.size());
          if (value.size() < 2 || value.front() != '`' || value.back() != '`') {
            throw CompatDocError(
                fmt::format("{}: `{}`: the value must be one JSON text in backticks, got '{}'",
                            where, d.key(), value));
          }
          try {
            d.returns = json::parse(value.substr(1, value.size() - 2));
          } catch (const json::parse_error& e) {
            throw CompatDocError(
                fmt::format("{}: `{}`: the value is not JSON: {}", where, d.key(), e.what()));
          }
        } else if (is_not_evaluated) {
          if (line.back() != ')') {
            throw CompatDocError(
                fmt::format("{}: `{}`: expected 'numesh: not evaluated (reason)', got '{}'", where,
                            d.key(), line));
          }
          d.not_evaluated =
              line.substr(kNotEvaluated.size(), line.size() - kNotEvaluated.size() - 1);
        } else if (starts_with(line, kOnlyAt)) {
          if (!d.differs_only_at.empty()) {
            throw CompatDocError(fmt::format("{}: `{}` already lists where it differs from eformer",
                                             where, d.key()));
          }
          d.differs_only_at = parse_pointers(line.substr(kOnlyAt.size()), where);
        } else {
          throw CompatDocError(fmt::format(
              "{}: unknown sub-item (expected '{}`JSON`', '{}reason)' or '{}`/pointer`, ...'): {}",
              where, kReturns.substr(4), kNotEvaluated.substr(4), kOnlyAt.substr(4), line));
        }
        if (d.not_evaluated && !d.differs_only_at.empty()) {
          throw CompatDocError(fmt::format(
              "{}: `{}`: a case that is not evaluated has no value to compare with eformer's",
              where, d.key()));
        }
      });
  if (!found_section) {
    throw CompatDocError(fmt::format("{} has no section \"## {}\"", doc.string(), kSection));
  }
  return out;
}

std::vector<UnevaluatedKind> load_unevaluated_kinds(const std::filesystem::path& doc) {
  static const std::regex row(R"(^\| `([^`]+)` \|.*\|\s*$)");
  std::vector<UnevaluatedKind> out;
  std::map<std::string, int> reason_lines;
  for_each_section_line(
      doc, kKindsSection, [&](const std::string& line, int n, const std::string& where) {
        if (!starts_with(line, "|")) return;
        if (!starts_with(line, "| `")) {
          // The header names the columns; the separator is dashes. Any other row must name a
          // reason, or it would silently document nothing.
          const bool separator = line.find_first_not_of("|-: ") == std::string::npos;
          if (starts_with(line, "| runner's reason") || separator) return;
          throw CompatDocError(fmt::format(
              "{}: a row must start with the runner's reason in backticks (| `reason` | ...): {}",
              where, line));
        }
        std::smatch m;
        if (!std::regex_match(line, m, row)) {
          throw CompatDocError(fmt::format(
              "{}: not a row of the form | `reason` | eformer | numesh | why |: {}", where, line));
        }
        UnevaluatedKind k{m[1], n};
        if (auto [it, fresh] = reason_lines.emplace(k.reason, n); !fresh) {
          throw CompatDocError(fmt::format("{}: the reason `{}` is already listed on line {}",
                                           where, k.reason, it->second));
        }
        out.push_back(std::move(k));
      });
  return out;
}

}  // namespace numesh::conformance
