#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "chat/jinja_value.hpp"

// Python's object model as jinja2's sandbox exposes it to a template: attribute and item access
// (with the str, dict and list methods templates call), slices, iteration, the arithmetic,
// comparison and membership operators, calls. Errors are EvalError with Python's message; the
// interpreter adds the template's name and line.

namespace numesh::models::chat {

/// An error while evaluating, without its place (the interpreter adds the line).
class EvalError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Fails as jinja2's Undefined does when used: with the message of how it came about.
[[noreturn]] void fail_undefined(const Value& undefined);

/// `object.name`: a method of a str, dict or list, else the dict's item or namespace's
/// attribute, else Undefined. Throws: EvalError when `object` is Undefined.
Value get_attribute(const Value& object, const std::string& name);
/// `object[key]`: a list's, tuple's or str's index (negative from the end), a dict's key, else
/// the attribute named `key`, else Undefined. Throws: EvalError when `object` is Undefined.
Value get_item(const Value& object, const Value& key);
/// `object[start:stop:step]` on a list, tuple or str (None for an omitted part).
/// Throws: EvalError for a step of 0, bounds that are not ints, an object that is not sliceable.
Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step);
/// The items a for loop or a filter walks: a list's items, a dict's keys, a str's characters;
/// nothing for Undefined. Throws: EvalError for a value that is not iterable.
std::vector<Value> iterate(const Value& value);
/// Python's len(). Throws: EvalError for a value without one.
std::int64_t length(const Value& value);
/// `a op b` for op in + - * / // % ** ~. Throws: EvalError as Python would (types, zero).
Value binary_op(const std::string& op, const Value& a, const Value& b);
/// `a op b` for op in == != < > <= >= in, "not in". Throws: EvalError for orderings Python
/// refuses ('<' between an int and a str) and membership in a non-container.
bool compare(const std::string& op, const Value& a, const Value& b);
/// `callee(args)`. Throws: EvalError when `callee` is not callable.
Value call(const Value& callee, CallArgs& args);

/// An argument of a builtin: the positional one at `index`, else the keyword `name`, else
/// `fallback`. Used by methods, filters, tests and globals.
Value argument(const CallArgs& args, std::size_t index, const std::string& name,
               Value fallback = Undefined{});
/// Python's int() of a number; Throws: EvalError naming `what` when it is not one.
std::int64_t as_int(const Value& value, const std::string& what);

}  // namespace numesh::models::chat
