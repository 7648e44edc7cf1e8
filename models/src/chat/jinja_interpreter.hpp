#pragma once

#include <string>

#include "chat/jinja_ast.hpp"

// Runs a parsed template as jinja2 runs its compiled form: a scope per for-loop iteration, per
// macro call and per with block (an if has none, so a set inside it stays), `loop` with
// jinja2's fields, break and continue, macros with defaults, set on namespace attributes.

namespace numesh::models::chat {

/// Refuses, as jinja2 does when it compiles a template, a filter or test it does not have.
/// Throws: ChatTemplateError naming the filter or test and its line.
void check_names(const Program& program);

/// The text of `program` rendered with `variables` (a dict) over the globals.
/// Throws: ChatTemplateError naming the line of the first error (raise_exception's included).
std::string render(const Program& program, const Value& variables);

}  // namespace numesh::models::chat
