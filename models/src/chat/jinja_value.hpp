#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <variant>
#include <vector>

// The values a chat template computes with, as Python's objects behave under jinja2: None, bool,
// int, float, str, list and tuple, dict (insertion-ordered, str keys), a namespace(), a callable
// (a macro, a global function, a bound method), and jinja2's Undefined (what a missing name,
// key or index gives: it prints as nothing, is false and empty, and fails when used further).
// Lists, dicts and namespaces are shared by reference, as in Python.

namespace numesh::models::chat {

struct Value;

/// jinja2's Undefined: `name` says what was missing, for the error when it is used.
struct Undefined {
  std::string name;
};
/// Python's None.
struct None {};

/// A list, a tuple (printed with parentheses), or what jinja2's filters return lazily: a
/// generator (select, map, unique...) or an iterator (reverse), which iterate as lists do but
/// have no len(), no index and are always true, as in Python.
struct ListObject {
  std::vector<Value> items;
  bool tuple = false;
  std::string iterator;  ///< "generator", "list_reverseiterator"; empty for a list or tuple
};

/// A dict in insertion order (Python's dicts keep it; tojson shows it). Keys are str (all of
/// JSON's), or the int, float, bool and None a template's literal may use; keys that are equal
/// in Python (1, 1.0, True) are one key.
struct DictObject {
  std::vector<std::pair<Value, Value>> items;
  /// The value of `key`; null when absent.
  [[nodiscard]] const Value* find(const Value& key) const;
  /// Sets `key`, keeping its place when present.
  void set(const Value& key, Value value);
};

/// A namespace(): attributes a template may set from inside loops.
struct NamespaceObject {
  DictObject attributes;
};

/// A call's arguments: positional, then keyword.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

/// Something a template can call: a macro, a global (range, namespace, raise_exception), a
/// method bound to its object.
struct CallableObject {
  std::string name;
  std::function<Value(CallArgs&)> call;
  bool macro = false;  ///< printed as <Macro 'name'>
};

using List = std::shared_ptr<ListObject>;
using Dict = std::shared_ptr<DictObject>;
using Namespace = std::shared_ptr<NamespaceObject>;
using Callable = std::shared_ptr<CallableObject>;

/// One value.
struct Value {
  std::variant<Undefined, None, bool, std::int64_t, double, std::string, List, Dict, Namespace,
               Callable>
      v;

  Value() = default;
  Value(Undefined u) : v(std::move(u)) {}      // NOLINT(google-explicit-constructor)
  Value(None n) : v(n) {}                      // NOLINT(google-explicit-constructor)
  Value(bool b) : v(b) {}                      // NOLINT(google-explicit-constructor)
  Value(std::int64_t i) : v(i) {}              // NOLINT(google-explicit-constructor)
  Value(int i) : v(std::int64_t{i}) {}         // NOLINT(google-explicit-constructor)
  Value(double d) : v(d) {}                    // NOLINT(google-explicit-constructor)
  Value(std::string s) : v(std::move(s)) {}    // NOLINT(google-explicit-constructor)
  Value(const char* s) : v(std::string(s)) {}  // NOLINT(google-explicit-constructor)
  Value(List l) : v(std::move(l)) {}           // NOLINT(google-explicit-constructor)
  Value(Dict d) : v(std::move(d)) {}           // NOLINT(google-explicit-constructor)
  Value(Namespace n) : v(std::move(n)) {}      // NOLINT(google-explicit-constructor)
  Value(Callable c) : v(std::move(c)) {}       // NOLINT(google-explicit-constructor)

  [[nodiscard]] bool undefined() const { return std::holds_alternative<Undefined>(v); }
  [[nodiscard]] bool none() const { return std::holds_alternative<None>(v); }
  [[nodiscard]] bool is_bool() const { return std::holds_alternative<bool>(v); }
  [[nodiscard]] bool is_int() const { return std::holds_alternative<std::int64_t>(v); }
  [[nodiscard]] bool is_float() const { return std::holds_alternative<double>(v); }
  /// int or float (bool too, as Python's bool is an int).
  [[nodiscard]] bool is_number() const { return is_int() || is_float() || is_bool(); }
  [[nodiscard]] bool is_string() const { return std::holds_alternative<std::string>(v); }
  [[nodiscard]] bool is_list() const { return std::holds_alternative<List>(v); }
  [[nodiscard]] bool is_dict() const { return std::holds_alternative<Dict>(v); }
  [[nodiscard]] bool is_namespace() const { return std::holds_alternative<Namespace>(v); }
  [[nodiscard]] bool is_callable() const { return std::holds_alternative<Callable>(v); }

  [[nodiscard]] const std::string& str() const { return std::get<std::string>(v); }
  [[nodiscard]] const List& list() const { return std::get<List>(v); }
  [[nodiscard]] const Dict& dict() const { return std::get<Dict>(v); }
};

/// A new list (a tuple with `tuple`).
Value make_list(std::vector<Value> items, bool tuple = false);
/// A lazy sequence of `items`: `kind` is Python's type name ("generator").
Value make_iterator(std::vector<Value> items, std::string kind);
/// Whether `value` is a generator or iterator (see ListObject).
bool is_iterator(const Value& value);
/// A new dict.
Value make_dict(std::vector<std::pair<Value, Value>> items = {});
/// A callable named `name`.
Value make_callable(std::string name, std::function<Value(CallArgs&)> call, bool macro = false);

/// A JSON value as the template sees it (objects keep their order; integers are ints).
Value from_json(const nlohmann::ordered_json& json);

/// Python's bool(value); Undefined is false.
bool truthy(const Value& value);
/// Python's type name ('int', 'str', 'dict', 'NoneType', 'Undefined'), for errors.
std::string type_name(const Value& value);
/// Python's str(value): what `{{ value }}` prints (Undefined prints nothing).
std::string to_str(const Value& value);
/// Python's repr(value).
std::string to_repr(const Value& value);
/// Python's float repr: shortest round trip, '1.0', '1e-05', '1e+16', 'inf', 'nan'.
std::string float_repr(double value);
/// Python's ==.
bool equal(const Value& a, const Value& b);

/// json.dumps(value, ensure_ascii=False, indent=indent, separators=..., sort_keys=...), as
/// transformers' tojson filter calls it. `indent` < 0 is None; `indent_text` overrides it
/// when `indent` is a string. Throws: std::invalid_argument naming a value JSON cannot hold.
struct JsonOptions {
  int indent = -1;
  std::string indent_text;
  bool indent_is_text = false;
  std::string item_separator;  ///< empty: Python's default for the indent
  std::string key_separator;   ///< empty: ": "
  bool has_separators = false;
  bool sort_keys = false;
  bool ensure_ascii = false;  ///< non-ASCII as \uXXXX (surrogate pairs past the BMP)
};
std::string to_json_text(const Value& value, const JsonOptions& options);

}  // namespace numesh::models::chat
