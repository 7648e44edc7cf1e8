#include "numesh/sharding/axis_rule.hpp"

#include <fmt/format.h>

namespace numesh::sharding {

AxisRule AxisRule::tuple(std::vector<AxisRule> members) {
  AxisRule r;
  r.kind_ = Kind::kTuple;
  r.members_ = std::move(members);
  return r;
}

AxisRule AxisRule::list(std::vector<AxisRule> members) {
  AxisRule r;
  r.kind_ = Kind::kList;
  r.members_ = std::move(members);
  return r;
}

AxisRule AxisRule::integer(std::int64_t value) {
  AxisRule r;
  r.kind_ = Kind::kInt;
  r.int_ = value;
  return r;
}

AxisRule AxisRule::unconstrained() {
  AxisRule r;
  r.kind_ = Kind::kUnconstrained;
  return r;
}

bool AxisRule::truthy() const noexcept {
  switch (kind_) {
    case Kind::kNone:
      return false;
    case Kind::kNotGiven:
    case Kind::kUnconstrained:
      return true;
    case Kind::kName:
      return !name_.empty();
    case Kind::kInt:
      return int_ != 0;
    case Kind::kTuple:
    case Kind::kList:
      return !members_.empty();
  }
  return false;
}

std::string python_repr(std::string_view text) {
  const bool has_single = text.find('\'') != std::string_view::npos;
  const bool has_double = text.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (char c : text) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c == quote) {
          out += '\\';
          out += c;
        } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  out += quote;
  return out;
}

std::string AxisRule::repr() const {
  switch (kind_) {
    case Kind::kNone:
      return "None";
    case Kind::kNotGiven:
      return "NOT_GIVEN";
    case Kind::kUnconstrained:
      return "UNCONSTRAINED";
    case Kind::kName:
      return python_repr(name_);
    case Kind::kInt:
      return std::to_string(int_);
    case Kind::kTuple:
    case Kind::kList: {
      std::string out = is_tuple() ? "(" : "[";
      for (std::size_t i = 0; i < members_.size(); ++i) {
        if (i) out += ", ";
        out += members_[i].repr();
      }
      // Python writes a one-element tuple with a trailing comma: ('a',).
      if (is_tuple() && members_.size() == 1) out += ",";
      out += is_tuple() ? ")" : "]";
      return out;
    }
  }
  return {};
}

bool operator==(const AxisRule& a, const AxisRule& b) noexcept {
  if (a.kind_ != b.kind_) return false;
  switch (a.kind_) {
    case AxisRule::Kind::kName:
      return a.name_ == b.name_;
    case AxisRule::Kind::kInt:
      return a.int_ == b.int_;
    case AxisRule::Kind::kTuple:
    case AxisRule::Kind::kList:
      return a.members_ == b.members_;
    default:
      return true;
  }
}

std::size_t hash_value(const AxisRule& rule) noexcept {
  std::size_t h = static_cast<std::size_t>(rule.kind()) * 0x9e3779b97f4a7c15ULL;
  auto mix = [&h](std::size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
  if (rule.is_name()) mix(std::hash<std::string>{}(rule.name()));
  if (rule.is_int()) mix(std::hash<std::int64_t>{}(rule.integer_value()));
  for (const AxisRule& m : rule.members()) mix(hash_value(m));
  return h;
}

}  // namespace numesh::sharding
