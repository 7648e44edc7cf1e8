#pragma once

#include <string>

#include "chat/jinja_value.hpp"

// jinja2's builtin filters, tests and globals that chat templates use, with transformers'
// additions (tojson as json.dumps without ASCII escapes, raise_exception, strftime_now). Each
// behaves as jinja2 3.1's; what numesh lacks is refused by name when the template is parsed.

namespace numesh::models::chat {

/// Whether there is a filter `name`.
bool has_filter(const std::string& name);
/// Whether there is a test `name`.
bool has_test(const std::string& name);
/// `value | name(args)`. Throws: EvalError as jinja2 would fail (wrong types, empty sequences).
Value apply_filter(const std::string& name, const Value& value, CallArgs& args);
/// `value is name(args)`. Throws: EvalError as jinja2 would fail.
bool apply_test(const std::string& name, const Value& value, CallArgs& args);
/// The globals a template sees beneath its variables: range, namespace, dict,
/// raise_exception, strftime_now.
Value make_globals();

}  // namespace numesh::models::chat
