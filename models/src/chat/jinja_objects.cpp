#include "chat/jinja_objects.hpp"

#include <fmt/format.h>
#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "chat/python_str.hpp"

namespace numesh::models::chat {

void fail_undefined(const Value& undefined) {
  throw EvalError(std::get<Undefined>(undefined.v).name);
}

Value argument(const CallArgs& args, std::size_t index, const std::string& name, Value fallback) {
  if (index < args.positional.size()) return args.positional[index];
  for (const auto& [key, value] : args.keyword) {
    if (key == name) return value;
  }
  return fallback;
}

std::int64_t as_int(const Value& value, const std::string& what) {
  if (value.is_int()) return std::get<std::int64_t>(value.v);
  if (value.is_bool()) return std::get<bool>(value.v) ? 1 : 0;
  throw EvalError(fmt::format("{} must be an integer, not '{}'", what, type_name(value)));
}

namespace {

double as_double(const Value& v) {
  if (v.is_float()) return std::get<double>(v.v);
  return static_cast<double>(as_int(v, "a number"));
}

// Python's str.title(): a cased letter after an uncased character starts a word.
std::string title_case(const std::string& text) {
  std::string out;
  bool previous_cased = false;
  for (char32_t c : code_points(text)) {
    out += previous_cased ? lower(from_code_points({c})) : title_char(c);
    previous_cased = is_cased(c);
  }
  return out;
}

// Python's str.capitalize(): the first character in titlecase, the rest lower-cased.
std::string capitalize(const std::string& text) {
  const std::vector<char32_t> points = code_points(text);
  if (points.empty()) return text;
  return title_char(points[0]) + lower(from_code_points({points.begin() + 1, points.end()}));
}

std::string replace_all(const std::string& text, const std::string& from, const std::string& to,
                        std::int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` around every character.
    const std::vector<char32_t> points = code_points(text);
    std::int64_t done = 0;
    for (char32_t c : points) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      out += from_code_points({c});
    }
    if (count < 0 || done < count) out += to;
    return out;
  }
  std::size_t start = 0;
  std::int64_t done = 0;
  while (count < 0 || done < count) {
    const std::size_t at = text.find(from, start);
    if (at == std::string::npos) break;
    out += text.substr(start, at - start) + to;
    start = at + from.size();
    ++done;
  }
  return out + text.substr(start);
}

const std::string& string_argument(const Value& v, const std::string& method) {
  if (!v.is_string()) {
    throw EvalError(fmt::format("{}() argument must be str, not {}", method, type_name(v)));
  }
  return v.str();
}

// str.startswith / endswith with a str or a tuple of str.
bool affix(const std::string& text, const Value& prefix, bool start, const std::string& method) {
  if (prefix.is_list()) {
    for (const Value& p : prefix.list()->items) {
      if (affix(text, p, start, method)) return true;
    }
    return false;
  }
  const std::string& p = string_argument(prefix, method);
  if (p.size() > text.size()) return false;
  return start ? text.compare(0, p.size(), p) == 0
               : text.compare(text.size() - p.size(), p.size(), p) == 0;
}

Value strings(const std::vector<std::string>& parts) {
  std::vector<Value> items(parts.begin(), parts.end());
  return make_list(std::move(items));
}

// A method of a str, bound to it; Undefined when str has no such method.
Value string_method(const std::string& s, const std::string& name) {
  using Fn = std::function<Value(CallArgs&)>;
  Fn fn;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    fn = [s, name](CallArgs& a) {
      const Value chars = argument(a, 0, "chars", None{});
      const std::string* set = chars.none() ? nullptr : &string_argument(chars, name);
      return Value(strip(s, name != "rstrip", name != "lstrip", set));
    };
  } else if (name == "split") {
    fn = [s](CallArgs& a) {
      const Value sep = argument(a, 0, "sep", None{});
      const std::int64_t max_split = as_int(argument(a, 1, "maxsplit", -1), "maxsplit");
      if (sep.is_string() && sep.str().empty()) throw EvalError("empty separator");
      return strings(split(s, sep.none() ? nullptr : &string_argument(sep, "split"),
                           static_cast<long>(max_split)));
    };
  } else if (name == "startswith" || name == "endswith") {
    fn = [s, name](CallArgs& a) {
      return Value(affix(s, argument(a, 0, "prefix"), name == "startswith", name));
    };
  } else if (name == "upper" || name == "lower") {
    fn = [s, name](CallArgs&) { return Value(name == "upper" ? upper(s) : lower(s)); };
  } else if (name == "title") {
    fn = [s](CallArgs&) { return Value(title_case(s)); };
  } else if (name == "capitalize") {
    fn = [s](CallArgs&) { return Value(capitalize(s)); };
  } else if (name == "replace") {
    fn = [s](CallArgs& a) {
      return Value(replace_all(s, string_argument(argument(a, 0, "old"), "replace"),
                               string_argument(argument(a, 1, "new"), "replace"),
                               as_int(argument(a, 2, "count", -1), "count")));
    };
  } else if (name == "find" || name == "count") {
    fn = [s, name](CallArgs& a) {
      const std::string& sub = string_argument(argument(a, 0, "sub"), name);
      if (name == "find") {
        const std::size_t at = s.find(sub);
        if (at == std::string::npos) return Value(-1);
        return Value(static_cast<std::int64_t>(code_points(s.substr(0, at)).size()));
      }
      if (sub.empty()) return Value(static_cast<std::int64_t>(code_points(s).size()) + 1);
      std::int64_t n = 0;
      for (std::size_t at = s.find(sub); at != std::string::npos;
           at = s.find(sub, at + sub.size())) {
        ++n;
      }
      return Value(n);
    };
  } else if (name == "join") {
    fn = [s](CallArgs& a) {
      std::string out;
      bool first = true;
      for (const Value& item : iterate(argument(a, 0, "iterable"))) {
        if (!first) out += s;
        first = false;
        out += string_argument(item, "join");
      }
      return Value(out);
    };
  } else {
    return Undefined{fmt::format("'str object' has no attribute '{}'", name)};
  }
  return make_callable(name, std::move(fn));
}

// A method of a dict (the ones that do not change it: jinja2's immutable sandbox refuses those).
Value dict_method(const Dict& d, const std::string& name) {
  using Fn = std::function<Value(CallArgs&)>;
  Fn fn;
  if (name == "items") {
    fn = [d](CallArgs&) {
      std::vector<Value> items;
      for (const auto& [key, value] : d->items) items.push_back(make_list({key, value}, true));
      return make_list(std::move(items));
    };
  } else if (name == "keys" || name == "values") {
    fn = [d, name](CallArgs&) {
      std::vector<Value> items;
      for (const auto& [key, value] : d->items) items.push_back(name == "keys" ? key : value);
      return make_list(std::move(items));
    };
  } else if (name == "get") {
    fn = [d](CallArgs& a) {
      const Value key = argument(a, 0, "key");
      const Value* found = d->find(key);
      return found != nullptr ? *found : argument(a, 1, "default", None{});
    };
  } else {
    return Undefined{};
  }
  return make_callable(name, std::move(fn));
}

// Python's index normalisation: negative from the end; nullopt when out of range.
std::optional<std::size_t> index_of(std::int64_t i, std::size_t size) {
  const auto n = static_cast<std::int64_t>(size);
  if (i < 0) i += n;
  if (i < 0 || i >= n) return std::nullopt;
  return static_cast<std::size_t>(i);
}

}  // namespace

Value get_attribute(const Value& object, const std::string& name) {
  if (object.undefined()) fail_undefined(object);
  if (object.is_string()) return string_method(object.str(), name);
  if (object.is_dict()) {
    Value method = dict_method(object.dict(), name);
    if (!method.undefined()) return method;
    if (const Value* found = object.dict()->find(name)) return *found;
    return Undefined{fmt::format("'dict object' has no attribute '{}'", name)};
  }
  if (object.is_namespace()) {
    if (const Value* found = std::get<Namespace>(object.v)->attributes.find(name)) return *found;
    return Undefined{fmt::format("'Namespace object' has no attribute '{}'", name)};
  }
  return Undefined{fmt::format("'{} object' has no attribute '{}'", type_name(object), name)};
}

Value get_item(const Value& object, const Value& key) {
  if (object.undefined()) fail_undefined(object);
  if (is_iterator(object)) {
    throw EvalError(fmt::format("'{}' object is not subscriptable", type_name(object)));
  }
  if (object.is_dict()) {
    if (const Value* found = object.dict()->find(key)) return *found;
    if (key.is_string()) {
      Value method = dict_method(object.dict(), key.str());
      if (!method.undefined()) return method;
    }
    return Undefined{fmt::format("'dict object' has no attribute {}", to_repr(key))};
  }
  if ((object.is_list() || object.is_string()) && (key.is_int() || key.is_bool())) {
    const std::int64_t i = as_int(key, "an index");
    if (object.is_list()) {
      const auto& items = object.list()->items;
      if (const auto at = index_of(i, items.size())) return items[*at];
    } else {
      const std::vector<char32_t> points = code_points(object.str());
      if (const auto at = index_of(i, points.size())) return from_code_points({points[*at]});
    }
    return Undefined{fmt::format("{} object has no element {}", type_name(object), i)};
  }
  if (key.is_string()) return get_attribute(object, key.str());
  return Undefined{fmt::format("'{} object' has no attribute {}", type_name(object), to_repr(key))};
}

namespace {

// Python's slice.indices(): the positions a slice visits over `size` items.
std::vector<std::size_t> slice_positions(const Value& start, const Value& stop, const Value& step,
                                         std::size_t size) {
  const std::int64_t n = static_cast<std::int64_t>(size);
  const std::int64_t st = step.none() ? 1 : as_int(step, "slice indices");
  if (st == 0) throw EvalError("slice step cannot be zero");
  const auto clamp = [&](const Value& v, std::int64_t fallback) {
    if (v.none()) return fallback;
    std::int64_t i = as_int(v, "slice indices");
    if (i < 0) i += n;
    if (st > 0) return std::clamp<std::int64_t>(i, 0, n);
    return std::clamp<std::int64_t>(i, -1, n - 1);
  };
  const std::int64_t lo = clamp(start, st > 0 ? 0 : n - 1);
  const std::int64_t hi = clamp(stop, st > 0 ? n : -1);
  std::vector<std::size_t> positions;
  for (std::int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) {
    positions.push_back(static_cast<std::size_t>(i));
  }
  return positions;
}

}  // namespace

Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step) {
  if (object.undefined()) fail_undefined(object);
  if (object.is_list() && !is_iterator(object)) {
    const auto& items = object.list()->items;
    std::vector<Value> out;
    for (std::size_t i : slice_positions(start, stop, step, items.size())) out.push_back(items[i]);
    return make_list(std::move(out), object.list()->tuple);
  }
  if (object.is_string()) {
    const std::vector<char32_t> points = code_points(object.str());
    std::vector<char32_t> out;
    for (std::size_t i : slice_positions(start, stop, step, points.size()))
      out.push_back(points[i]);
    return from_code_points(out);
  }
  throw EvalError(fmt::format("'{}' object is not subscriptable", type_name(object)));
}

std::vector<Value> iterate(const Value& value) {
  if (value.undefined()) return {};
  if (value.is_list()) return value.list()->items;
  if (value.is_dict()) {
    std::vector<Value> keys;
    for (const auto& item : value.dict()->items) keys.emplace_back(item.first);
    return keys;
  }
  if (value.is_string()) {
    std::vector<Value> chars;
    for (char32_t c : code_points(value.str())) chars.emplace_back(from_code_points({c}));
    return chars;
  }
  throw EvalError(fmt::format("'{}' object is not iterable", type_name(value)));
}

std::int64_t length(const Value& value) {
  if (value.undefined()) return 0;
  if (value.is_string()) return static_cast<std::int64_t>(code_points(value.str()).size());
  if (value.is_list() && !is_iterator(value)) {
    return static_cast<std::int64_t>(value.list()->items.size());
  }
  if (value.is_dict()) return static_cast<std::int64_t>(value.dict()->items.size());
  if (value.is_namespace()) {
    return static_cast<std::int64_t>(std::get<Namespace>(value.v)->attributes.items.size());
  }
  throw EvalError(fmt::format("object of type '{}' has no len()", type_name(value)));
}

namespace {

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  throw EvalError(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a),
                              type_name(b)));
}

[[noreturn]] void overflow() { throw EvalError("integer overflow (numesh's ints are 64-bit)"); }

Value int_op(const std::string& op, std::int64_t x, std::int64_t y) {
  std::int64_t r = 0;
  if (op == "+" || op == "-" || op == "*") {
    const bool overflowed = op == "+"   ? __builtin_add_overflow(x, y, &r)
                            : op == "-" ? __builtin_sub_overflow(x, y, &r)
                                        : __builtin_mul_overflow(x, y, &r);
    if (overflowed) overflow();
    return r;
  }
  if (op == "/") {
    if (y == 0) throw EvalError("division by zero");
    return static_cast<double>(x) / static_cast<double>(y);
  }
  if (op == "//" || op == "%") {
    if (y == 0)
      throw EvalError(op == "%" ? "integer modulo by zero" : "integer division or modulo by zero");
    std::int64_t q = x / y;
    std::int64_t m = x % y;
    if (m != 0 && ((m < 0) != (y < 0))) {
      --q;
      m += y;
    }
    return op == "//" ? q : m;
  }
  // **: a negative exponent gives a float, as in Python.
  if (y < 0) return std::pow(static_cast<double>(x), static_cast<double>(y));
  std::int64_t result = 1;
  for (std::int64_t i = 0; i < y; ++i) {
    if (__builtin_mul_overflow(result, x, &result)) overflow();
  }
  return result;
}

Value float_op(const std::string& op, double x, double y) {
  if (op == "+") return x + y;
  if (op == "-") return x - y;
  if (op == "*") return x * y;
  if (op == "**") return std::pow(x, y);
  if (y == 0.0) throw EvalError(op == "/" ? "float division by zero" : "float modulo");
  if (op == "/") return x / y;
  const double m = std::fmod(x, y);
  const double mod = (m != 0.0 && ((m < 0) != (y < 0))) ? m + y : m;
  if (op == "%") return mod;
  return std::floor((x - mod) / y);  // Python's float //: (x - x % y) / y, exact
}

// A str or list repeated past this many bytes or items is refused (jinja2's sandbox refuses
// ranges past 100000 for the same reason: a template must not exhaust the memory).
constexpr std::int64_t kMaxRepeat = std::int64_t{1} << 24;

Value repeat(const Value& seq, std::int64_t times) {
  const auto unit =
      static_cast<std::int64_t>(seq.is_string() ? seq.str().size() : seq.list()->items.size());
  if (times > 0 && unit > 0 && times > kMaxRepeat / unit) {
    throw EvalError(fmt::format("a repetition past {} bytes or items", kMaxRepeat));
  }
  if (seq.is_string()) {
    std::string out;
    for (std::int64_t i = 0; i < times; ++i) out += seq.str();
    return out;
  }
  std::vector<Value> out;
  for (std::int64_t i = 0; i < times; ++i) {
    out.insert(out.end(), seq.list()->items.begin(), seq.list()->items.end());
  }
  return make_list(std::move(out), seq.list()->tuple);
}

}  // namespace

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return to_str(a) + to_str(b);
  if (a.undefined()) fail_undefined(a);
  if (b.undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) return int_op(op, as_int(a, op), as_int(b, op));
    return float_op(op, as_double(a), as_double(b));
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) return a.str() + b.str();
    if (a.is_list() && b.is_list() && a.list()->tuple == b.list()->tuple && !is_iterator(a) &&
        !is_iterator(b)) {
      std::vector<Value> items = a.list()->items;
      items.insert(items.end(), b.list()->items.begin(), b.list()->items.end());
      return make_list(std::move(items), a.list()->tuple);
    }
    if (a.is_string()) {
      throw EvalError(fmt::format("can only concatenate str (not \"{}\") to str",
                                  type_name(a.is_string() ? b : a)));
    }
  }
  if (op == "*") {
    const bool a_seq = a.is_string() || a.is_list();
    const bool b_seq = b.is_string() || b.is_list();
    if (a_seq && (b.is_int() || b.is_bool())) return repeat(a, as_int(b, "*"));
    if (b_seq && (a.is_int() || a.is_bool())) return repeat(b, as_int(a, "*"));
  }
  unsupported(op, a, b);
}

namespace {

bool contains(const Value& container, const Value& item) {
  if (container.undefined()) return false;  // jinja2's Undefined iterates as empty
  if (container.is_string()) {
    if (!item.is_string()) {
      throw EvalError(
          fmt::format("'in <string>' requires string as left operand, not {}", type_name(item)));
    }
    return container.str().find(item.str()) != std::string::npos;
  }
  if (container.is_dict()) return container.dict()->find(item) != nullptr;
  if (container.is_list()) {
    for (const Value& x : container.list()->items) {
      if (equal(x, item)) return true;
    }
    return false;
  }
  throw EvalError(fmt::format("argument of type '{}' is not iterable", type_name(container)));
}

// -1, 0, 1 as Python orders numbers, strs and lists; throws for what it cannot order.
int order(const std::string& op, const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) {
      const std::int64_t x = as_int(a, op);
      const std::int64_t y = as_int(b, op);
      return x < y ? -1 : x > y ? 1 : 0;
    }
    const double x = as_double(a);
    const double y = as_double(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    // UTF-8's byte order is the code points' order.
    const int c = a.str().compare(b.str());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.list()->tuple == b.list()->tuple) {
    const auto& x = a.list()->items;
    const auto& y = b.list()->items;
    for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equal(x[i], y[i])) return order(op, x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  if (a.undefined()) fail_undefined(a);
  if (b.undefined()) fail_undefined(b);
  throw EvalError(fmt::format("'{}' not supported between instances of '{}' and '{}'", op,
                              type_name(a), type_name(b)));
}

}  // namespace

bool compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equal(a, b);
  if (op == "!=") return !equal(a, b);
  if (op == "in") return contains(b, a);
  if (op == "not in") return !contains(b, a);
  const int c = order(op, a, b);
  if (op == "<") return c < 0;
  if (op == ">") return c > 0;
  if (op == "<=") return c <= 0;
  return c >= 0;
}

Value call(const Value& callee, CallArgs& args) {
  if (callee.undefined()) fail_undefined(callee);
  if (!callee.is_callable()) {
    throw EvalError(fmt::format("'{}' object is not callable", type_name(callee)));
  }
  return std::get<Callable>(callee.v)->call(args);
}

}  // namespace numesh::models::chat
