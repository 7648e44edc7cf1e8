#include "numesh/sharding/partition_spec.hpp"

#include <cctype>

#include "numesh/core/error.hpp"

namespace numesh::sharding {

AxisRule canonicalize_entry(const AxisRule& entry) {
  if (!entry.truthy()) return AxisRule();
  if (!entry.is_sequence()) return entry;
  for (const AxisRule& member : entry.members()) {
    if (member.is_sequence()) {
      throw ValueError(fmt::format(
          "A tuple inside PartitionSpec cannot contain a nested tuple. Got partition: {} and "
          "the nested tuple: {}",
          entry.repr(), member.repr()));
    }
  }
  if (entry.members().size() == 1) return entry.members().front();
  return AxisRule::tuple(entry.members());
}

PartitionSpec::PartitionSpec(std::initializer_list<AxisRule> entries)
    : PartitionSpec(std::vector<AxisRule>(entries)) {}

PartitionSpec::PartitionSpec(std::vector<AxisRule> entries) {
  entries_.reserve(entries.size());
  for (const AxisRule& e : entries) entries_.push_back(canonicalize_entry(e));
}

PartitionSpec PartitionSpec::replicated(std::size_t rank) {
  return PartitionSpec(std::vector<AxisRule>(rank));
}

bool PartitionSpec::is_fully_replicated() const noexcept {
  for (const AxisRule& e : entries_) {
    if (!e.is_none()) return false;
  }
  return true;
}

std::vector<std::string> PartitionSpec::entry_names(std::size_t i) const {
  const AxisRule& e = entries_.at(i);
  if (e.is_name()) return {e.name()};
  std::vector<std::string> names;
  for (const AxisRule& m : e.members()) {
    if (m.is_name()) names.push_back(m.name());
  }
  return names;
}

std::string PartitionSpec::repr() const {
  std::string out = "P(";
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    if (i) out += ", ";
    out += entries_[i].repr();
  }
  if (entries_.size() == 1) out += ",";
  out += ")";
  return out;
}

std::size_t hash_value(const PartitionSpec& spec) noexcept {
  std::size_t h = spec.size();
  for (const AxisRule& e : spec) h ^= hash_value(e) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h;
}

namespace {

// A small recursive-descent parser for the spec grammar documented on PartitionSpec::parse.
class SpecParser {
 public:
  explicit SpecParser(std::string_view text) : text_(text) {}

  PartitionSpec parse() {
    skip_space();
    bool wrapped = false;
    if (text_.substr(pos_, 2) == "P(") {
      wrapped = true;
      pos_ += 2;
    }
    std::vector<AxisRule> entries = parse_list(wrapped ? ')' : '\0');
    if (wrapped) expect(')');
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text");
    return PartitionSpec(std::move(entries));
  }

 private:
  // Parses comma-separated entries up to `close` (or the end of the text when close is 0).
  // An empty text gives no entries; a trailing comma is allowed, as in Python.
  std::vector<AxisRule> parse_list(char close) {
    std::vector<AxisRule> out;
    skip_space();
    if (at_end_of_list(close)) return out;
    while (true) {
      out.push_back(parse_entry());
      skip_space();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        skip_space();
        if (at_end_of_list(close)) return out;
        continue;
      }
      return out;
    }
  }

  bool at_end_of_list(char close) const {
    return pos_ == text_.size() || (close != '\0' && text_[pos_] == close);
  }

  AxisRule parse_entry() {
    skip_space();
    if (pos_ == text_.size()) fail("expected an entry");
    const char c = text_[pos_];
    if (c == '(' || c == '[') {
      const char close = c == '(' ? ')' : ']';
      ++pos_;
      std::vector<AxisRule> members = parse_list(close);
      expect(close);
      return AxisRule::tuple(std::move(members));
    }
    if (c == '\'' || c == '"') return AxisRule(parse_quoted(c));
    const std::size_t start = pos_;
    while (pos_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_' ||
            text_[pos_] == '-' || text_[pos_] == '.')) {
      ++pos_;
    }
    if (pos_ == start) fail("expected a name, None, or a tuple");
    std::string word(text_.substr(start, pos_ - start));
    if (word == "None" || word == "null") return AxisRule();
    return AxisRule(std::move(word));
  }

  // A quoted name, as Python reads a string literal: the escapes python_repr writes (\\, \n,
  // \r, \t, \xHH and the quote) are decoded, so that parse(spec.repr()) gives spec back for any
  // name; any other backslash is kept with the character after it, as Python keeps unknown
  // escapes.
  std::string parse_quoted(char quote) {
    std::string name;
    for (++pos_; pos_ < text_.size(); ++pos_) {
      const char c = text_[pos_];
      if (c == quote) {
        ++pos_;
        return name;
      }
      if (c != '\\' || pos_ + 1 == text_.size()) {
        name += c;
        continue;
      }
      const char e = text_[++pos_];
      switch (e) {
        case 'n':
          name += '\n';
          break;
        case 'r':
          name += '\r';
          break;
        case 't':
          name += '\t';
          break;
        case '\\':
        case '\'':
        case '"':
          name += e;
          break;
        case 'x': {
          const auto hex = [](char h) {
            return std::isxdigit(static_cast<unsigned char>(h)) != 0
                       ? (std::isdigit(static_cast<unsigned char>(h)) != 0
                              ? h - '0'
                              : (std::tolower(h) - 'a' + 10))
                       : -1;
          };
          const int hi = pos_ + 2 < text_.size() ? hex(text_[pos_ + 1]) : -1;
          const int lo = pos_ + 2 < text_.size() ? hex(text_[pos_ + 2]) : -1;
          if (hi < 0 || lo < 0) fail("truncated \\xHH escape");
          name += static_cast<char>(hi * 16 + lo);
          pos_ += 2;
          break;
        }
        default:
          name += '\\';
          name += e;
      }
    }
    fail("unterminated quote");
  }

  void expect(char c) {
    skip_space();
    if (pos_ >= text_.size() || text_[pos_] != c) fail(fmt::format("expected '{}'", c));
    ++pos_;
  }

  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw ValueError(fmt::format("cannot parse partition spec {}: {} at offset {}",
                                 python_repr(text_), what, pos_));
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

}  // namespace

PartitionSpec PartitionSpec::parse(std::string_view text) { return SpecParser(text).parse(); }

}  // namespace numesh::sharding
