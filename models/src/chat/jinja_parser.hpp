#pragma once

#include <string>

#include "chat/jinja_ast.hpp"

// Jinja's grammar, the part chat templates use: statements if/elif/else, for (with else, a
// filter condition and tuple targets), set (names, namespace attributes, blocks), macro, with,
// break/continue and transformers' generation marker; expressions with jinja2's precedence
// (conditional, or, and, not, comparisons and `in`, + -, ~, * / // %, **, unary, postfix
// attribute/item/slice/call, filters and `is` tests), literals, lists, tuples and dicts.

namespace numesh::models::chat {

/// The program of `source`. Throws: ChatTemplateError naming `name` and the line of the first
/// syntax error, unknown or unclosed tag.
Program parse_template(const std::string& source, const std::string& name);

}  // namespace numesh::models::chat
