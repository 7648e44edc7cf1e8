#include "chat/jinja_value.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <stdexcept>

#include "chat/python_str.hpp"

namespace numesh::models::chat {

const Value* DictObject::find(const Value& key) const {
  for (const auto& [k, value] : items) {
    if (equal(k, key)) return &value;
  }
  return nullptr;
}

void DictObject::set(const Value& key, Value value) {
  for (auto& [k, existing] : items) {
    if (equal(k, key)) {
      existing = std::move(value);
      return;
    }
  }
  items.emplace_back(key, std::move(value));
}

Value make_list(std::vector<Value> items, bool tuple) {
  auto list = std::make_shared<ListObject>();
  list->items = std::move(items);
  list->tuple = tuple;
  return Value(std::move(list));
}

Value make_iterator(std::vector<Value> items, std::string kind) {
  Value v = make_list(std::move(items));
  v.list()->iterator = std::move(kind);
  return v;
}

bool is_iterator(const Value& value) { return value.is_list() && !value.list()->iterator.empty(); }

Value make_dict(std::vector<std::pair<Value, Value>> items) {
  auto dict = std::make_shared<DictObject>();
  dict->items = std::move(items);
  return Value(std::move(dict));
}

Value make_callable(std::string name, std::function<Value(CallArgs&)> call, bool macro) {
  auto callable = std::make_shared<CallableObject>();
  callable->name = std::move(name);
  callable->call = std::move(call);
  callable->macro = macro;
  return Value(std::move(callable));
}

Value from_json(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None{};
    case nlohmann::ordered_json::value_t::boolean:
      return json.get<bool>();
    case nlohmann::ordered_json::value_t::number_integer:
      return json.get<std::int64_t>();
    case nlohmann::ordered_json::value_t::number_unsigned: {
      // Past int64 a JSON integer is kept as the nearest float, not wrapped.
      const auto u = json.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(INT64_MAX)) return static_cast<double>(u);
      return static_cast<std::int64_t>(u);
    }
    case nlohmann::ordered_json::value_t::number_float:
      return json.get<double>();
    case nlohmann::ordered_json::value_t::string:
      return json.get<std::string>();
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(from_json(item));
      return make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      std::vector<std::pair<Value, Value>> items;
      items.reserve(json.size());
      for (const auto& [key, item] : json.items()) items.emplace_back(Value(key), from_json(item));
      return make_dict(std::move(items));
    }
    default:
      return None{};
  }
}

bool truthy(const Value& value) {
  return std::visit(
      [](const auto& x) -> bool {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Undefined> || std::is_same_v<T, None>) {
          return false;
        } else if constexpr (std::is_same_v<T, bool>) {
          return x;
        } else if constexpr (std::is_same_v<T, std::int64_t>) {
          return x != 0;
        } else if constexpr (std::is_same_v<T, double>) {
          return x != 0.0;
        } else if constexpr (std::is_same_v<T, std::string>) {
          return !x.empty();
        } else if constexpr (std::is_same_v<T, List>) {
          return !x->iterator.empty() || !x->items.empty();
        } else if constexpr (std::is_same_v<T, Dict>) {
          return !x->items.empty();
        } else {
          return true;
        }
      },
      value.v);
}

std::string type_name(const Value& value) {
  static constexpr const char* kNames[] = {"Undefined", "NoneType", "bool", "int",
                                           "float",     "str",      "list", "dict",
                                           "Namespace", "function"};
  if (is_iterator(value)) return value.list()->iterator;
  if (value.is_list() && value.list()->tuple) return "tuple";
  return kNames[value.v.index()];
}

std::string float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  // The shortest digits that round-trip, laid out as Python's repr lays them: positional for
  // exponents -4..15, else d.ddde+XX.
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
  (void)ec;
  const std::string text(buf, end);
  const std::size_t e_pos = text.find('e');
  std::string mantissa = text.substr(0, e_pos);
  const int exponent = std::stoi(text.substr(e_pos + 1));
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out;
  }
  if (exponent < 0) {
    out += "0." + std::string(static_cast<std::size_t>(-exponent - 1), '0') + digits;
    return out;
  }
  const auto whole = static_cast<std::size_t>(exponent) + 1;
  if (digits.size() <= whole) {
    out += digits + std::string(whole - digits.size(), '0') + ".0";
  } else {
    out += digits.substr(0, whole) + "." + digits.substr(whole);
  }
  return out;
}

namespace {

std::string sequence_repr(const ListObject& list) {
  if (!list.iterator.empty()) return "<" + list.iterator + " object>";
  std::string out = list.tuple ? "(" : "[";
  for (std::size_t i = 0; i < list.items.size(); ++i) {
    if (i > 0) out += ", ";
    out += to_repr(list.items[i]);
  }
  if (list.tuple && list.items.size() == 1) out += ",";
  out += list.tuple ? ")" : "]";
  return out;
}

std::string dict_repr(const DictObject& dict) {
  std::string out = "{";
  for (std::size_t i = 0; i < dict.items.size(); ++i) {
    if (i > 0) out += ", ";
    out += to_repr(dict.items[i].first) + ": " + to_repr(dict.items[i].second);
  }
  return out + "}";
}

}  // namespace

std::string to_repr(const Value& value) {
  if (value.is_string()) return string_repr(value.str());
  if (value.undefined()) return "Undefined";
  return to_str(value);
}

std::string to_str(const Value& value) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Undefined>) {
          return "";
        } else if constexpr (std::is_same_v<T, None>) {
          return "None";
        } else if constexpr (std::is_same_v<T, bool>) {
          return x ? "True" : "False";
        } else if constexpr (std::is_same_v<T, std::int64_t>) {
          return std::to_string(x);
        } else if constexpr (std::is_same_v<T, double>) {
          return float_repr(x);
        } else if constexpr (std::is_same_v<T, std::string>) {
          return x;
        } else if constexpr (std::is_same_v<T, List>) {
          return sequence_repr(*x);
        } else if constexpr (std::is_same_v<T, Dict>) {
          return dict_repr(*x);
        } else if constexpr (std::is_same_v<T, Namespace>) {
          return "<Namespace " + dict_repr(x->attributes) + ">";
        } else {
          return x->macro ? "<Macro '" + x->name + "'>" : "<built-in function " + x->name + ">";
        }
      },
      value.v);
}

namespace {

// The number of a bool, int or float, for Python's mixed comparisons.
double number_of(const Value& v) {
  if (v.is_bool()) return std::get<bool>(v.v) ? 1.0 : 0.0;
  if (v.is_int()) return static_cast<double>(std::get<std::int64_t>(v.v));
  return std::get<double>(v.v);
}

}  // namespace

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) {
      const auto as_int = [](const Value& v) {
        return v.is_bool() ? std::int64_t{std::get<bool>(v.v)} : std::get<std::int64_t>(v.v);
      };
      return as_int(a) == as_int(b);
    }
    return number_of(a) == number_of(b);
  }
  if (a.v.index() != b.v.index()) return false;
  if (a.undefined() || a.none()) return true;
  if (a.is_string()) return a.str() == b.str();
  if (is_iterator(a) || is_iterator(b)) return a.list() == b.list();
  if (a.is_list()) {
    const auto& x = *a.list();
    const auto& y = *b.list();
    if (x.tuple != y.tuple || x.items.size() != y.items.size()) return false;
    for (std::size_t i = 0; i < x.items.size(); ++i) {
      if (!equal(x.items[i], y.items[i])) return false;
    }
    return true;
  }
  if (a.is_dict()) {
    const auto& x = *a.dict();
    const auto& y = *b.dict();
    if (x.items.size() != y.items.size()) return false;
    for (const auto& [key, item] : x.items) {
      const Value* other = y.find(key);
      if (other == nullptr || !equal(item, *other)) return false;
    }
    return true;
  }
  if (a.is_namespace()) return std::get<Namespace>(a.v) == std::get<Namespace>(b.v);
  return std::get<Callable>(a.v) == std::get<Callable>(b.v);
}

namespace {

std::string json_string(const std::string& s, bool ensure_ascii) {
  std::string out = "\"";
  if (ensure_ascii) {
    for (char32_t c : code_points(s)) {
      if (c <
          0x7F) {  // Python escapes all but ' ' to '~' (and the control characters' short forms)
        std::string one = json_string(std::string(1, static_cast<char>(c)), false);
        out += one.substr(1, one.size() - 2);
      } else if (c < 0x10000) {
        out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
      } else {
        const char32_t v = c - 0x10000;
        out += fmt::format("\\u{:04x}\\u{:04x}", static_cast<unsigned>(0xD800 + (v >> 10)),
                           static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
      }
    }
    return out + "\"";
  }
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
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
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

struct JsonWriter {
  const JsonOptions& options;
  std::string out;

  [[nodiscard]] bool indented() const { return options.indent_is_text || options.indent >= 0; }
  [[nodiscard]] std::string indent_unit() const {
    return options.indent_is_text ? options.indent_text
                                  : std::string(static_cast<std::size_t>(options.indent), ' ');
  }
  [[nodiscard]] std::string item_separator() const {
    if (options.has_separators) return options.item_separator;
    return indented() ? "," : ", ";
  }
  [[nodiscard]] std::string key_separator() const {
    return options.has_separators ? options.key_separator : ": ";
  }
  void newline(int depth) {
    if (!indented()) return;
    out += '\n';
    const std::string unit = indent_unit();
    for (int i = 0; i < depth; ++i) out += unit;
  }

  // json.dumps's text of a key: a str as it is, other keys as JSON writes them.
  static std::string key_text(const Value& key) {
    if (key.is_string()) return key.str();
    if (key.none()) return "null";
    if (key.is_bool()) return std::get<bool>(key.v) ? "true" : "false";
    if (key.is_int()) return std::to_string(std::get<std::int64_t>(key.v));
    if (key.is_float()) {
      const double d = std::get<double>(key.v);
      return std::isnan(d)   ? "NaN"
             : std::isinf(d) ? (d < 0 ? "-Infinity" : "Infinity")
                             : float_repr(d);
    }
    throw std::invalid_argument(
        fmt::format("keys must be str, int, float, bool or None, not {}", type_name(key)));
  }

  void write(const Value& value, int depth) {
    if (value.none()) {
      out += "null";
    } else if (value.is_bool()) {
      out += std::get<bool>(value.v) ? "true" : "false";
    } else if (value.is_int()) {
      out += std::to_string(std::get<std::int64_t>(value.v));
    } else if (value.is_float()) {
      const double d = std::get<double>(value.v);
      out += std::isnan(d)   ? "NaN"
             : std::isinf(d) ? (d < 0 ? "-Infinity" : "Infinity")
                             : float_repr(d);
    } else if (value.is_string()) {
      out += json_string(value.str(), options.ensure_ascii);
    } else if (value.is_list() && !is_iterator(value)) {
      write_list(*value.list(), depth);
    } else if (value.is_dict()) {
      write_dict(*value.dict(), depth);
    } else {
      throw std::invalid_argument(
          fmt::format("Object of type {} is not JSON serializable", type_name(value)));
    }
  }

  void write_list(const ListObject& list, int depth) {
    if (list.items.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (std::size_t i = 0; i < list.items.size(); ++i) {
      if (i > 0) out += item_separator();
      newline(depth + 1);
      write(list.items[i], depth + 1);
    }
    newline(depth);
    out += ']';
  }

  void write_dict(const DictObject& dict, int depth) {
    if (dict.items.empty()) {
      out += "{}";
      return;
    }
    std::vector<std::pair<std::string, const Value*>> items;
    for (const auto& [key, item] : dict.items) items.emplace_back(key_text(key), &item);
    if (options.sort_keys) {
      // Python sorts the keys themselves: strs among strs only.
      for (const auto& [key, item] : dict.items) {
        if (!key.is_string()) {
          throw std::invalid_argument(
              fmt::format("'<' not supported between instances of '{}' and 'str'", type_name(key)));
        }
      }
      std::stable_sort(items.begin(), items.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
    }
    out += '{';
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out += item_separator();
      newline(depth + 1);
      out += json_string(items[i].first, options.ensure_ascii) + key_separator();
      write(*items[i].second, depth + 1);
    }
    newline(depth);
    out += '}';
  }
};

}  // namespace

std::string to_json_text(const Value& value, const JsonOptions& options) {
  JsonWriter writer{options, {}};
  writer.write(value, 0);
  return std::move(writer.out);
}

}  // namespace numesh::models::chat
