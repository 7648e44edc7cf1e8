#include "chat/jinja_filters.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <functional>
#include <map>

#include "chat/jinja_objects.hpp"
#include "chat/python_str.hpp"

namespace numesh::models::chat {

namespace {

using Filter = std::function<Value(const Value&, CallArgs&)>;
using Test = std::function<bool(const Value&, CallArgs&)>;

// jinja2's soft_str: str() of anything, Undefined as nothing.
std::string text_of(const Value& v) { return to_str(v); }

// `item.a.b` for a dotted attribute, as jinja2's make_attrgetter walks it (an int part is an
// index). An int part past 64 bits is an index no list or dict holds: Undefined, as jinja2's
// lookup of it gives.
Value attribute_path(const Value& item, const std::string& path) {
  Value v = item;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    std::int64_t index = 0;
    if (digits) {
      const std::from_chars_result read =
          std::from_chars(part.data(), part.data() + part.size(), index);
      v = read.ec == std::errc() ? get_item(v, Value(index)) : Value(Undefined{part});
    } else {
      v = get_item(v, Value(part));
    }
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

// The arguments after the first `skip` positional ones, for a test or filter named inside
// another filter (select('equalto', 3), map('replace', 'a', 'b')).
CallArgs rest_of(const CallArgs& args, std::size_t skip) {
  CallArgs rest;
  if (args.positional.size() > skip) {
    rest.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(skip),
                           args.positional.end());
  }
  return rest;
}

std::string name_argument(const Value& v, const std::string& what) {
  if (!v.is_string()) throw EvalError(fmt::format("{} must be a string", what));
  return v.str();
}

// select / reject / selectattr / rejectattr.
Value select(const Value& seq, CallArgs& args, bool by_attribute, bool keep) {
  const std::size_t first_test = by_attribute ? 1 : 0;
  const std::string attribute =
      by_attribute ? name_argument(argument(args, 0, "attribute"), "the attribute") : "";
  const Value test = argument(args, first_test, "test", None{});
  CallArgs test_args = rest_of(args, first_test + 1);
  std::vector<Value> out;
  for (const Value& item : iterate(seq)) {
    const Value subject = by_attribute ? attribute_path(item, attribute) : item;
    const bool passed = test.none()
                            ? truthy(subject)
                            : apply_test(name_argument(test, "the test"), subject, test_args);
    if (passed == keep) out.push_back(item);
  }
  return make_iterator(std::move(out), "generator");
}

Value map_filter(const Value& seq, CallArgs& args) {
  std::vector<Value> out;
  const Value attribute = argument({{}, args.keyword}, 99, "attribute", Undefined{});
  if (!attribute.undefined()) {
    const Value fallback = argument({{}, args.keyword}, 99, "default", Undefined{});
    for (const Value& item : iterate(seq)) {
      Value v = attribute_path(item, name_argument(attribute, "attribute"));
      out.push_back(v.undefined() && !fallback.undefined() ? fallback : v);
    }
    return make_iterator(std::move(out), "generator");
  }
  const std::string filter = name_argument(argument(args, 0, "filter"), "map's filter");
  if (!has_filter(filter)) throw EvalError(fmt::format("No filter named '{}'.", filter));
  CallArgs filter_args = rest_of(args, 1);
  for (const Value& item : iterate(seq)) out.push_back(apply_filter(filter, item, filter_args));
  return make_iterator(std::move(out), "generator");
}

// Python's round(x, n): ties to even, on the float's exact value (printf's correct rounding).
Value round_filter(const Value& v, CallArgs& args) {
  const std::int64_t precision = as_int(argument(args, 0, "precision", 0), "precision");
  const std::string method = text_of(argument(args, 1, "method", "common"));
  if (method != "common" && method != "ceil" && method != "floor") {
    throw EvalError("method must be 'common', 'ceil' or 'floor'");
  }
  if (!v.is_float()) {
    if (method == "common") return v.is_bool() ? Value(as_int(v, "round")) : v;
  }
  const double x = v.is_float() ? std::get<double>(v.v) : static_cast<double>(as_int(v, "round"));
  const double scale = std::pow(10.0, static_cast<double>(precision));
  if (method == "ceil") return std::ceil(x * scale) / scale;
  if (method == "floor") return std::floor(x * scale) / scale;
  if (precision < 0)
    return std::nearbyint(x / std::pow(10.0, -static_cast<double>(precision))) *
           std::pow(10.0, -static_cast<double>(precision));
  return std::strtod(fmt::format("{:.{}f}", x, precision).c_str(), nullptr);
}

Value int_filter(const Value& v, CallArgs& args) {
  const Value fallback = argument(args, 0, "default", 0);
  if (v.is_int()) return v;
  if (v.is_bool()) return as_int(v, "int");
  if (v.is_float()) return static_cast<std::int64_t>(std::trunc(std::get<double>(v.v)));
  if (v.is_string()) {
    const std::string s = strip(v.str(), true, true, nullptr);
    try {
      std::size_t used = 0;
      const long long i =
          std::stoll(s, &used, static_cast<int>(as_int(argument(args, 1, "base", 10), "base")));
      if (used == s.size()) return static_cast<std::int64_t>(i);
    } catch (const std::exception&) {
    }
    try {
      std::size_t used = 0;
      const double d = std::stod(s, &used);
      if (used == s.size()) return static_cast<std::int64_t>(std::trunc(d));
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

Value float_filter(const Value& v, CallArgs& args) {
  const Value fallback = argument(args, 0, "default", 0.0);
  if (v.is_float()) return v;
  if (v.is_int() || v.is_bool()) return static_cast<double>(as_int(v, "float"));
  if (v.is_string()) {
    try {
      std::size_t used = 0;
      const std::string s = strip(v.str(), true, true, nullptr);
      const double d = std::stod(s, &used);
      if (used == s.size()) return d;
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False), positional arguments in that order.
Value tojson_filter(const Value& v, CallArgs& args) {
  JsonOptions options;
  options.ensure_ascii = truthy(argument(args, 0, "ensure_ascii", false));
  const Value indent = argument(args, 1, "indent", None{});
  if (indent.is_string()) {
    options.indent_is_text = true;
    options.indent_text = indent.str();
  } else if (!indent.none()) {
    options.indent = static_cast<int>(std::max<std::int64_t>(0, as_int(indent, "indent")));
  }
  const Value separators = argument(args, 2, "separators", None{});
  if (!separators.none()) {
    const std::vector<Value> parts = iterate(separators);
    if (parts.size() != 2) throw EvalError("separators must be an (item, key) pair");
    options.has_separators = true;
    options.item_separator = name_argument(parts[0], "a separator");
    options.key_separator = name_argument(parts[1], "a separator");
  }
  options.sort_keys = truthy(argument(args, 3, "sort_keys", false));
  try {
    return to_json_text(v, options);
  } catch (const std::invalid_argument& e) {
    throw EvalError(e.what());
  }
}

// jinja2's title filter: each piece after a run of '-', whitespace, '(', '{', '[' or '<' gets
// its first character upper-cased and the rest lower-cased.
std::string title_filter(const std::string& s) {
  const std::vector<char32_t> points = code_points(s);
  const auto separator = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_space(c);
  };
  std::string out;
  std::size_t i = 0;
  while (i < points.size()) {
    std::size_t j = i;
    const bool sep = separator(points[i]);
    while (j < points.size() && separator(points[j]) == sep) ++j;
    const std::vector<char32_t> head = {points[i]};
    out += upper(from_code_points(head)) +
           lower(from_code_points({points.begin() + static_cast<std::ptrdiff_t>(i + 1),
                                   points.begin() + static_cast<std::ptrdiff_t>(j)}));
    i = j;
  }
  return out;
}

std::string indent_filter(const std::string& s, CallArgs& args) {
  const Value width = argument(args, 0, "width", 4);
  const std::string pad =
      width.is_string()
          ? width.str()
          : std::string(static_cast<std::size_t>(std::max<std::int64_t>(0, as_int(width, "width"))),
                        ' ');
  const bool first = truthy(argument(args, 1, "first", false));
  const bool blank = truthy(argument(args, 2, "blank", false));
  std::string out;
  std::size_t start = 0;
  bool first_line = true;
  while (true) {
    const std::size_t nl = s.find('\n', start);
    const std::string line = s.substr(start, nl == std::string::npos ? nl : nl - start);
    const bool indent_it = first_line ? first : (blank || !line.empty());
    if (!first_line) out += '\n';
    out += (indent_it ? pad : "") + line;
    if (nl == std::string::npos) break;
    start = nl + 1;
    first_line = false;
  }
  return out;
}

std::string escape_html(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// The key a sort, unique, min or max compares: the attribute, and strs lower-cased unless case
// sensitive.
Value sort_key(const Value& item, CallArgs& args, std::size_t case_index, std::size_t attr_index) {
  const Value attribute = argument(args, attr_index, "attribute", None{});
  Value key = attribute.none() ? item : attribute_path(item, name_argument(attribute, "attribute"));
  if (!truthy(argument(args, case_index, "case_sensitive", false)) && key.is_string()) {
    key = lower(key.str());
  }
  return key;
}

Value sort_filter(const Value& v, CallArgs& args) {
  std::vector<Value> items = iterate(v);
  std::vector<std::pair<Value, Value>> keyed;
  for (Value& item : items) keyed.emplace_back(sort_key(item, args, 1, 2), std::move(item));
  const bool reverse = truthy(argument(args, 0, "reverse", false));
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return reverse ? compare("<", b.first, a.first) : compare("<", a.first, b.first);
  });
  std::vector<Value> out;
  for (auto& [key, item] : keyed) out.push_back(std::move(item));
  return make_list(std::move(out));
}

Value unique_filter(const Value& v, CallArgs& args) {
  std::vector<Value> out;
  std::vector<Value> seen;
  for (const Value& item : iterate(v)) {
    const Value key = sort_key(item, args, 0, 1);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, key); })) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return make_iterator(std::move(out), "generator");
}

Value extreme(const Value& v, CallArgs& args, bool maximum) {
  const std::vector<Value> items = iterate(v);
  if (items.empty()) return Undefined{"No aggregated item, sequence was empty."};
  std::size_t best = 0;
  for (std::size_t i = 1; i < items.size(); ++i) {
    const bool better = compare(maximum ? ">" : "<", sort_key(items[i], args, 0, 1),
                                sort_key(items[best], args, 0, 1));
    if (better) best = i;
  }
  return items[best];
}

const std::map<std::string, Filter>& filters() {
  static const std::map<std::string, Filter> table = [] {
    std::map<std::string, Filter> t;
    t["trim"] = [](const Value& v, CallArgs& a) {
      const Value chars = argument(a, 0, "chars", None{});
      const std::string set = chars.none() ? "" : text_of(chars);
      return Value(strip(text_of(v), true, true, chars.none() ? nullptr : &set));
    };
    t["length"] = [](const Value& v, CallArgs&) { return Value(length(v)); };
    t["count"] = t["length"];
    t["tojson"] = tojson_filter;
    t["string"] = [](const Value& v, CallArgs&) { return Value(text_of(v)); };
    t["upper"] = [](const Value& v, CallArgs&) { return Value(upper(text_of(v))); };
    t["lower"] = [](const Value& v, CallArgs&) { return Value(lower(text_of(v))); };
    t["capitalize"] = [](const Value& v, CallArgs&) {
      CallArgs none;
      return call(get_attribute(Value(text_of(v)), "capitalize"), none);
    };
    t["title"] = [](const Value& v, CallArgs&) { return Value(title_filter(text_of(v))); };
    t["replace"] = [](const Value& v, CallArgs& a) {
      CallArgs method_args;
      method_args.positional = {text_of(argument(a, 0, "old")), text_of(argument(a, 1, "new"))};
      const Value count = argument(a, 2, "count", None{});
      if (!count.none()) method_args.positional.push_back(count);
      return call(get_attribute(Value(text_of(v)), "replace"), method_args);
    };
    t["default"] = [](const Value& v, CallArgs& a) {
      const bool boolean = truthy(argument(a, 1, "boolean", false));
      const bool use_default = v.undefined() || (boolean && !truthy(v));
      return use_default ? argument(a, 0, "default_value", "") : v;
    };
    t["d"] = t["default"];
    t["join"] = [](const Value& v, CallArgs& a) {
      const std::string separator = text_of(argument(a, 0, "d", ""));
      const Value attribute = argument(a, 1, "attribute", None{});
      std::string out;
      bool first = true;
      for (const Value& item : iterate(v)) {
        if (!first) out += separator;
        first = false;
        out += text_of(attribute.none() ? item : attribute_path(item, text_of(attribute)));
      }
      return Value(out);
    };
    t["first"] = [](const Value& v, CallArgs&) {
      const std::vector<Value> items = iterate(v);
      return items.empty() ? Value(Undefined{"No first item, sequence was empty."}) : items.front();
    };
    t["last"] = [](const Value& v, CallArgs&) {
      const std::vector<Value> items = iterate(v);
      return items.empty() ? Value(Undefined{"No last item, sequence was empty."}) : items.back();
    };
    t["items"] = [](const Value& v, CallArgs& a) {
      if (v.undefined()) return make_iterator({}, "generator");
      if (!v.is_dict()) throw EvalError("Can only get item pairs from a mapping.");
      return make_iterator(iterate(call(get_attribute(v, "items"), a)), "generator");
    };
    t["selectattr"] = [](const Value& v, CallArgs& a) { return select(v, a, true, true); };
    t["rejectattr"] = [](const Value& v, CallArgs& a) { return select(v, a, true, false); };
    t["select"] = [](const Value& v, CallArgs& a) { return select(v, a, false, true); };
    t["reject"] = [](const Value& v, CallArgs& a) { return select(v, a, false, false); };
    t["map"] = map_filter;
    t["list"] = [](const Value& v, CallArgs&) { return make_list(iterate(v)); };
    t["abs"] = [](const Value& v, CallArgs&) -> Value {
      if (v.is_float()) return std::fabs(std::get<double>(v.v));
      const std::int64_t i = as_int(v, "abs's argument");
      return i < 0 ? -i : i;
    };
    t["int"] = int_filter;
    t["float"] = float_filter;
    t["round"] = round_filter;
    t["reverse"] = [](const Value& v, CallArgs&) -> Value {
      if (v.is_string()) return get_slice(v, None{}, None{}, -1);
      std::vector<Value> items = iterate(v);
      std::reverse(items.begin(), items.end());
      // reversed() of a list is an iterator; of anything else jinja2 makes a list first.
      return v.is_list() && !is_iterator(v)
                 ? make_iterator(std::move(items), "list_reverseiterator")
                 : make_list(std::move(items));
    };
    t["sort"] = sort_filter;
    t["unique"] = unique_filter;
    t["min"] = [](const Value& v, CallArgs& a) { return extreme(v, a, false); };
    t["max"] = [](const Value& v, CallArgs& a) { return extreme(v, a, true); };
    t["sum"] = [](const Value& v, CallArgs& a) {
      const Value attribute = argument(a, 0, "attribute", None{});
      Value total = argument(a, 1, "start", 0);
      for (const Value& item : iterate(v)) {
        total = binary_op("+", total,
                          attribute.none() ? item : attribute_path(item, text_of(attribute)));
      }
      return total;
    };
    t["safe"] = [](const Value& v, CallArgs&) { return v; };
    t["escape"] = [](const Value& v, CallArgs&) { return Value(escape_html(text_of(v))); };
    t["e"] = t["escape"];
    t["indent"] = [](const Value& v, CallArgs& a) { return Value(indent_filter(text_of(v), a)); };
    t["wordcount"] = [](const Value& v, CallArgs&) {
      std::int64_t words = 0;
      bool in_word = false;
      for (char32_t c : code_points(text_of(v))) {
        const bool word = is_word(c);
        if (word && !in_word) ++words;
        in_word = word;
      }
      return Value(words);
    };
    return t;
  }();
  return table;
}

bool is_true(const Value& v) { return v.is_bool() && std::get<bool>(v.v); }
bool is_false(const Value& v) { return v.is_bool() && !std::get<bool>(v.v); }

const std::map<std::string, Test>& tests() {
  static const std::map<std::string, Test> table = [] {
    std::map<std::string, Test> t;
    t["defined"] = [](const Value& v, CallArgs&) { return !v.undefined(); };
    t["undefined"] = [](const Value& v, CallArgs&) { return v.undefined(); };
    t["none"] = [](const Value& v, CallArgs&) { return v.none(); };
    t["boolean"] = [](const Value& v, CallArgs&) { return v.is_bool(); };
    t["true"] = [](const Value& v, CallArgs&) { return is_true(v); };
    t["false"] = [](const Value& v, CallArgs&) { return is_false(v); };
    t["integer"] = [](const Value& v, CallArgs&) { return v.is_int(); };
    t["float"] = [](const Value& v, CallArgs&) { return v.is_float(); };
    t["number"] = [](const Value& v, CallArgs&) { return v.is_number(); };
    t["string"] = [](const Value& v, CallArgs&) { return v.is_string(); };
    t["mapping"] = [](const Value& v, CallArgs&) { return v.is_dict(); };
    t["iterable"] = [](const Value& v, CallArgs&) {
      return v.undefined() || v.is_string() || v.is_list() || v.is_dict();
    };
    t["sequence"] = t["iterable"];
    t["callable"] = [](const Value& v, CallArgs&) { return v.is_callable(); };
    t["sameas"] = [](const Value& v, CallArgs& a) {
      const Value other = argument(a, 0, "other");
      if (v.v.index() != other.v.index()) return false;
      // Containers by identity (Python's `is`), scalars by value.
      if (v.is_list()) return v.list() == other.list();
      if (v.is_dict()) return v.dict() == other.dict();
      if (v.is_namespace()) return std::get<Namespace>(v.v) == std::get<Namespace>(other.v);
      if (v.is_callable()) return std::get<Callable>(v.v) == std::get<Callable>(other.v);
      return equal(v, other);
    };
    const auto comparison = [](const char* op) {
      return [op](const Value& v, CallArgs& a) { return compare(op, v, argument(a, 0, "other")); };
    };
    for (const char* name : {"==", "eq", "equalto"}) t[name] = comparison("==");
    for (const char* name : {"!=", "ne"}) t[name] = comparison("!=");
    for (const char* name : {"<", "lt", "lessthan"}) t[name] = comparison("<");
    for (const char* name : {"<=", "le"}) t[name] = comparison("<=");
    for (const char* name : {">", "gt", "greaterthan"}) t[name] = comparison(">");
    for (const char* name : {">=", "ge"}) t[name] = comparison(">=");
    t["in"] = [](const Value& v, CallArgs& a) { return compare("in", v, argument(a, 0, "seq")); };
    t["odd"] = [](const Value& v, CallArgs&) { return equal(binary_op("%", v, 2), 1); };
    t["even"] = [](const Value& v, CallArgs&) { return equal(binary_op("%", v, 2), 0); };
    t["divisibleby"] = [](const Value& v, CallArgs& a) {
      return equal(binary_op("%", v, argument(a, 0, "num")), 0);
    };
    t["lower"] = [](const Value& v, CallArgs&) { return is_lower(text_of(v)); };
    t["upper"] = [](const Value& v, CallArgs&) { return is_upper(text_of(v)); };
    t["filter"] = [](const Value& v, CallArgs&) { return v.is_string() && has_filter(v.str()); };
    t["test"] = [](const Value& v, CallArgs&) { return v.is_string() && has_test(v.str()); };
    return t;
  }();
  return table;
}

}  // namespace

bool has_filter(const std::string& name) { return filters().count(name) > 0; }
bool has_test(const std::string& name) { return tests().count(name) > 0; }

Value apply_filter(const std::string& name, const Value& value, CallArgs& args) {
  const auto it = filters().find(name);
  if (it == filters().end()) throw EvalError(fmt::format("No filter named '{}'.", name));
  return it->second(value, args);
}

bool apply_test(const std::string& name, const Value& value, CallArgs& args) {
  const auto it = tests().find(name);
  if (it == tests().end()) throw EvalError(fmt::format("No test named '{}'.", name));
  return it->second(value, args);
}

namespace {

// jinja2's sandbox caps range() at 100000 items.
constexpr std::int64_t kMaxRange = 100000;

Value range_global(CallArgs& a) {
  std::int64_t start = 0;
  std::int64_t stop = 0;
  std::int64_t step = 1;
  if (a.positional.size() == 1) {
    stop = as_int(a.positional[0], "range's stop");
  } else if (a.positional.size() >= 2) {
    start = as_int(a.positional[0], "range's start");
    stop = as_int(a.positional[1], "range's stop");
    if (a.positional.size() > 2) step = as_int(a.positional[2], "range's step");
  } else {
    throw EvalError("range expected at least 1 argument, got 0");
  }
  if (step == 0) throw EvalError("range() arg 3 must not be zero");
  std::vector<Value> items;
  for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (static_cast<std::int64_t>(items.size()) >= kMaxRange) {
      throw EvalError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    }
    items.emplace_back(i);
  }
  return make_list(std::move(items));
}

// namespace(mapping, **kwargs) and dict(mapping, **kwargs).
DictObject keyword_dict(CallArgs& a) {
  DictObject d;
  for (const Value& initial : a.positional) {
    if (!initial.is_dict()) throw EvalError("namespace() and dict() take a mapping");
    for (const auto& [key, value] : initial.dict()->items) d.set(key, value);
  }
  for (const auto& [key, value] : a.keyword) d.set(key, value);
  return d;
}

}  // namespace

Value make_globals() {
  DictObject g;
  g.set("range", make_callable("range", range_global));
  g.set("namespace", make_callable("namespace", [](CallArgs& a) {
          auto ns = std::make_shared<NamespaceObject>();
          ns->attributes = keyword_dict(a);
          return Value(ns);
        }));
  g.set("dict", make_callable("dict", [](CallArgs& a) {
          auto d = std::make_shared<DictObject>(keyword_dict(a));
          return Value(d);
        }));
  g.set("raise_exception", make_callable("raise_exception", [](CallArgs& a) -> Value {
          throw EvalError(text_of(argument(a, 0, "message", "")));
        }));
  g.set("strftime_now", make_callable("strftime_now", [](CallArgs& a) {
          const std::string format = text_of(argument(a, 0, "format"));
          const std::time_t now = std::time(nullptr);
          std::tm local{};
          localtime_r(&now, &local);
          char buf[256];
          const std::size_t n = std::strftime(buf, sizeof buf, format.c_str(), &local);
          return Value(std::string(buf, n));
        }));
  return make_dict(std::move(g.items));
}

}  // namespace numesh::models::chat
