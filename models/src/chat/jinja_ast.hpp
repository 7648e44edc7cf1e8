#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja_value.hpp"
#include "numesh/models/chat/chat_template.hpp"

// A parsed chat template: statements (text, output, if, for, set, macro...) over expressions,
// each with the template line it came from, for errors.

namespace numesh::models::chat {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

/// What an expression node does.
enum class ExprKind {
  kLiteral,    ///< `literal`
  kName,       ///< the variable `name`
  kList,       ///< [children...]
  kTuple,      ///< (children...)
  kDict,       ///< {children[0]: children[1], ...}
  kAttribute,  ///< children[0].name
  kItem,       ///< children[0][children[1]]
  kSlice,      ///< children[0][children[1]:children[2]:children[3]] (null: omitted)
  kCall,       ///< children[0](children[1...], keywords)
  kFilter,     ///< children[0] | name(children[1...], keywords)
  kTest,       ///< children[0] is [not] name(children[1...])
  kUnary,      ///< `name` ("-", "+", "not") children[0]
  kBinary,     ///< children[0] `name` children[1]: + - * / // % ** ~ and or
  kCompare,    ///< children[0] ops[0] children[1] ops[1] children[2]...
  kCondition,  ///< children[0] if children[1] else children[2] (children[2] may be null)
};

/// An expression node.
struct Expr {
  ExprKind kind = ExprKind::kLiteral;
  int line = 0;
  Value literal;
  std::string name;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  std::vector<std::string> ops;
  bool negated = false;
};

struct Node;
using Body = std::vector<Node>;

/// What a statement does.
enum class NodeKind {
  kText,      ///< writes `text`
  kOutput,    ///< {{ expr }}
  kIf,        ///< branches (condition, body) in order, then else_body
  kFor,       ///< for targets in expr [if filter]: body, else else_body
  kSet,       ///< set targets (or targets[0].attribute) = expr
  kSetBlock,  ///< set targets[0] %}body{% endset: the body's text
  kMacro,     ///< macro `text`(params): body
  kWith,      ///< with params (as assignments): body
  kBreak,
  kContinue,
  kBlock,  ///< body in its own place ({% generation %}, transformers' marker)
};

/// A statement node.
struct Node {
  NodeKind kind = NodeKind::kText;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::vector<std::string> targets;
  std::string attribute;
  std::vector<std::pair<std::string, ExprPtr>> params;
};

/// A whole template.
struct Program {
  std::string name;
  Body body;
};

/// Throws the ChatTemplateError of template `name` at `line`: "NAME line N: MESSAGE".
[[noreturn]] void fail(const std::string& name, int line, const std::string& message);

}  // namespace numesh::models::chat
