#include "chat/jinja_parser.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <initializer_list>
#include <stdexcept>

#include "chat/jinja_lexer.hpp"

namespace numesh::models::chat {

void fail(const std::string& name, int line, const std::string& message) {
  throw ChatTemplateError(fmt::format("chat template {} line {}: {}", name, line, message), line);
}

namespace {

// Deeper nesting than this (of tags or of expressions) is refused, so that a template cannot
// overflow the parser's stack.
constexpr int kMaxNesting = 256;

ExprPtr make_expr(ExprKind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

ExprPtr unary(std::string op, ExprPtr operand, int line) {
  ExprPtr e = make_expr(ExprKind::kUnary, line);
  e->name = std::move(op);
  e->children.push_back(std::move(operand));
  return e;
}

ExprPtr binary(std::string op, ExprPtr left, ExprPtr right, int line) {
  ExprPtr e = make_expr(ExprKind::kBinary, line);
  e->name = std::move(op);
  e->children.push_back(std::move(left));
  e->children.push_back(std::move(right));
  return e;
}

std::string describe(const Token& t) {
  switch (t.kind) {
    case TokenKind::kEnd:
      return "end of template";
    case TokenKind::kBlockEnd:
      return "end of statement block";
    case TokenKind::kVariableEnd:
      return "end of print statement";
    case TokenKind::kString:
      return "string";
    default:
      return "'" + t.text + "'";
  }
}

class Parser {
 public:
  Parser(std::vector<Token> tokens, const std::string& name)
      : tokens_(std::move(tokens)), name_(name) {}

  Body parse_all() {
    std::string end;
    Body body = parse_until({}, end);
    return body;
  }

 private:
  // Counts one level of nesting while it lives.
  class Nest {
   public:
    explicit Nest(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxNesting) {
        fail(p_.name_, p_.peek().line,
             fmt::format("the template nests deeper than {} levels", kMaxNesting));
      }
    }
    ~Nest() { --p_.depth_; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;

   private:
    Parser& p_;
  };

  // ---- tokens --------------------------------------------------------------------------------
  const Token& peek(std::size_t k = 0) const {
    return tokens_[std::min(i_ + k, tokens_.size() - 1)];
  }
  const Token& next() {
    const Token& t = tokens_[i_];
    if (i_ + 1 < tokens_.size()) ++i_;
    return t;
  }
  bool at_op(std::string_view op, std::size_t k = 0) const {
    return peek(k).kind == TokenKind::kOperator && peek(k).text == op;
  }
  bool at_name(std::string_view name, std::size_t k = 0) const {
    return peek(k).kind == TokenKind::kName && peek(k).text == name;
  }
  [[noreturn]] void unexpected(const std::string& expected) const {
    fail(name_, peek().line, fmt::format("unexpected {}, expected {}", describe(peek()), expected));
  }
  void expect_op(std::string_view op) {
    if (!at_op(op)) unexpected("'" + std::string(op) + "'");
    next();
  }
  std::string expect_name() {
    if (peek().kind != TokenKind::kName) unexpected("a name");
    return next().text;
  }
  void expect_block_end() {
    if (peek().kind != TokenKind::kBlockEnd) unexpected("end of statement block");
    next();
  }

  // ---- statements ----------------------------------------------------------------------------
  // Statements until a block tag named in `ends` (its name consumed into `end`, the rest of
  // that tag left to the caller) or, with no ends, the end of the template.
  Body parse_until(std::initializer_list<std::string_view> ends, std::string& end) {
    const Nest nest(*this);
    Body body;
    while (true) {
      const Token& t = peek();
      if (t.kind == TokenKind::kEnd) {
        if (ends.size() == 0) return body;
        fail(name_, t.line,
             fmt::format("unexpected end of template, expected '{}'", *(ends.end() - 1)));
      }
      if (t.kind == TokenKind::kText) {
        Node node;
        node.kind = NodeKind::kText;
        node.line = t.line;
        node.text = next().text;
        body.push_back(std::move(node));
      } else if (t.kind == TokenKind::kVariableBegin) {
        Node node;
        node.kind = NodeKind::kOutput;
        node.line = next().line;
        node.expr = parse_tuple(true, false);
        if (peek().kind != TokenKind::kVariableEnd) unexpected("end of print statement");
        next();
        body.push_back(std::move(node));
      } else {
        next();  // {%
        const Token& tag = peek();
        for (std::string_view e : ends) {
          if (at_name(e)) {
            end = next().text;
            return body;
          }
        }
        if (tag.kind != TokenKind::kName) unexpected("a tag name");
        body.push_back(statement());
      }
    }
  }

  Node statement() {
    const Token tag = next();
    Node node;
    node.line = tag.line;
    if (tag.text == "if") return if_statement(std::move(node));
    if (tag.text == "for") return for_statement(std::move(node));
    if (tag.text == "set") return set_statement(std::move(node));
    if (tag.text == "macro") return macro_statement(std::move(node));
    if (tag.text == "with") return with_statement(std::move(node));
    if (tag.text == "break" || tag.text == "continue") {
      node.kind = tag.text == "break" ? NodeKind::kBreak : NodeKind::kContinue;
      expect_block_end();
      return node;
    }
    if (tag.text == "generation") {
      // transformers' marker of the assistant's tokens: its body renders in place.
      node.kind = NodeKind::kBlock;
      expect_block_end();
      std::string end;
      node.body = parse_until({"endgeneration"}, end);
      expect_block_end();
      return node;
    }
    fail(name_, tag.line, fmt::format("Encountered unknown tag '{}'.", tag.text));
  }

  Node if_statement(Node node) {
    node.kind = NodeKind::kIf;
    std::string end = "elif";
    while (end == "elif") {
      ExprPtr condition = parse_tuple(false, false);
      expect_block_end();
      Body body = parse_until({"elif", "else", "endif"}, end);
      node.branches.emplace_back(std::move(condition), std::move(body));
    }
    if (end == "else") {
      expect_block_end();
      node.else_body = parse_until({"endif"}, end);
    }
    expect_block_end();
    return node;
  }

  void assign_targets(Node& node) {
    const bool parenthesized = at_op("(");
    if (parenthesized) next();
    node.targets.push_back(expect_name());
    while (at_op(",")) {
      next();
      if (peek().kind != TokenKind::kName || at_name("in")) break;
      node.targets.push_back(expect_name());
    }
    if (parenthesized) expect_op(")");
  }

  Node for_statement(Node node) {
    node.kind = NodeKind::kFor;
    assign_targets(node);
    if (!at_name("in")) unexpected("'in'");
    next();
    node.expr = parse_tuple(false, false);
    if (at_name("if")) {
      next();
      node.filter = parse_expression(true);
    }
    if (at_name("recursive")) fail(name_, peek().line, "recursive for loops are not supported");
    expect_block_end();
    std::string end;
    node.body = parse_until({"endfor", "else"}, end);
    if (end == "else") {
      expect_block_end();
      node.else_body = parse_until({"endfor"}, end);
    }
    expect_block_end();
    return node;
  }

  Node set_statement(Node node) {
    node.kind = NodeKind::kSet;
    node.targets.push_back(expect_name());
    if (at_op(".")) {
      next();
      node.attribute = expect_name();
    } else {
      while (at_op(",")) {
        next();
        node.targets.push_back(expect_name());
      }
    }
    if (at_op("=")) {
      next();
      node.expr = parse_tuple(true, false);
      expect_block_end();
      return node;
    }
    if (node.targets.size() != 1 || !node.attribute.empty()) unexpected("'='");
    node.kind = NodeKind::kSetBlock;
    expect_block_end();
    std::string end;
    node.body = parse_until({"endset"}, end);
    expect_block_end();
    return node;
  }

  Node macro_statement(Node node) {
    node.kind = NodeKind::kMacro;
    node.text = expect_name();
    expect_op("(");
    while (!at_op(")")) {
      if (!node.params.empty()) expect_op(",");
      if (at_op(")")) break;
      std::string param = expect_name();
      ExprPtr default_value;
      if (at_op("=")) {
        next();
        default_value = parse_expression(true);
      }
      node.params.emplace_back(std::move(param), std::move(default_value));
    }
    next();
    expect_block_end();
    std::string end;
    node.body = parse_until({"endmacro"}, end);
    expect_block_end();
    return node;
  }

  Node with_statement(Node node) {
    node.kind = NodeKind::kWith;
    while (peek().kind != TokenKind::kBlockEnd) {
      if (!node.params.empty()) expect_op(",");
      std::string target = expect_name();
      expect_op("=");
      node.params.emplace_back(std::move(target), parse_expression(true));
    }
    next();
    std::string end;
    node.body = parse_until({"endwith"}, end);
    expect_block_end();
    return node;
  }

  // ---- expressions ---------------------------------------------------------------------------
  bool tuple_end() const {
    const TokenKind k = peek().kind;
    return k == TokenKind::kVariableEnd || k == TokenKind::kBlockEnd || at_op(")");
  }

  ExprPtr parse_tuple(bool condexpr, bool explicit_parentheses) {
    const int line = peek().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (tuple_end()) break;
      items.push_back(parse_expression(condexpr));
      if (!at_op(",")) break;
      is_tuple = true;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parentheses) unexpected("an expression");
    }
    ExprPtr e = make_expr(ExprKind::kTuple, line);
    e->children = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool condexpr) {
    const Nest nest(*this);
    return condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    ExprPtr expr = parse_or();
    while (at_name("if")) {
      const int line = next().line;
      ExprPtr test = parse_or();
      ExprPtr otherwise;
      if (at_name("else")) {
        next();
        otherwise = parse_condexpr();
      }
      ExprPtr e = make_expr(ExprKind::kCondition, line);
      e->children.push_back(std::move(expr));
      e->children.push_back(std::move(test));
      e->children.push_back(std::move(otherwise));
      expr = std::move(e);
    }
    return expr;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (at_name("or")) {
      const int line = next().line;
      left = binary("or", std::move(left), parse_and(), line);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (at_name("and")) {
      const int line = next().line;
      left = binary("and", std::move(left), parse_not(), line);
    }
    return left;
  }

  ExprPtr parse_not() {
    const Nest nest(*this);
    if (at_name("not")) {
      const int line = next().line;
      return unary("not", parse_not(), line);
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = peek().line;
    ExprPtr first = parse_math1();
    ExprPtr e;
    while (true) {
      std::string op;
      if (peek().kind == TokenKind::kOperator &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == ">" ||
           peek().text == "<=" || peek().text == ">=")) {
        op = next().text;
      } else if (at_name("in")) {
        next();
        op = "in";
      } else if (at_name("not") && at_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      if (!e) {
        e = make_expr(ExprKind::kCompare, line);
        e->children.push_back(std::move(first));
      }
      e->ops.push_back(std::move(op));
      e->children.push_back(parse_math1());
    }
    return e ? std::move(e) : std::move(first);
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (at_op("+") || at_op("-")) {
      const Token& t = next();
      left = binary(t.text, std::move(left), parse_concat(), t.line);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (at_op("~")) {
      const int line = next().line;
      left = binary("~", std::move(left), parse_math2(), line);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const Token& t = next();
      left = binary(t.text, std::move(left), parse_pow(), t.line);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (at_op("**")) {
      const int line = next().line;
      left = binary("**", std::move(left), parse_unary(true), line);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    const Nest nest(*this);
    ExprPtr node;
    if (at_op("-") || at_op("+")) {
      const Token& t = next();
      node = unary(t.text, parse_unary(false), t.line);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  // An integer token's value (Python's ints are unbounded; numesh's are 64-bit).
  std::int64_t integer_literal(const std::string& text, int line) const {
    try {
      return static_cast<std::int64_t>(std::stoll(text));
    } catch (const std::out_of_range&) {
      fail(name_, line, fmt::format("the integer {} is past 64 bits", text));
    }
  }

  ExprPtr literal(Value v, int line) {
    ExprPtr e = make_expr(ExprKind::kLiteral, line);
    e->literal = std::move(v);
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    const int line = t.line;
    switch (t.kind) {
      case TokenKind::kName: {
        const std::string name = next().text;
        if (name == "true" || name == "True") return literal(true, line);
        if (name == "false" || name == "False") return literal(false, line);
        if (name == "none" || name == "None") return literal(None{}, line);
        ExprPtr e = make_expr(ExprKind::kName, line);
        e->name = name;
        return e;
      }
      case TokenKind::kString: {
        std::string text = next().text;
        while (peek().kind == TokenKind::kString) text += next().text;
        return literal(std::move(text), line);
      }
      case TokenKind::kInteger:
        return literal(integer_literal(next().text, line), line);
      case TokenKind::kFloat:
        return literal(std::strtod(next().text.c_str(), nullptr), line);
      default:
        break;
    }
    if (at_op("(")) {
      next();
      ExprPtr e = parse_tuple(true, true);
      expect_op(")");
      return e;
    }
    if (at_op("[")) return parse_list();
    if (at_op("{")) return parse_dict();
    unexpected("an expression");
  }

  ExprPtr parse_list() {
    ExprPtr e = make_expr(ExprKind::kList, next().line);
    while (!at_op("]")) {
      if (!e->children.empty()) expect_op(",");
      if (at_op("]")) break;
      e->children.push_back(parse_expression(true));
    }
    next();
    return e;
  }

  ExprPtr parse_dict() {
    ExprPtr e = make_expr(ExprKind::kDict, next().line);
    while (!at_op("}")) {
      if (!e->children.empty()) expect_op(",");
      if (at_op("}")) break;
      e->children.push_back(parse_expression(true));
      expect_op(":");
      e->children.push_back(parse_expression(true));
    }
    next();
    return e;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (at_op(".")) {
        const int line = next().line;
        if (peek().kind == TokenKind::kInteger) {
          ExprPtr e = make_expr(ExprKind::kItem, line);
          e->children.push_back(std::move(node));
          e->children.push_back(literal(integer_literal(next().text, line), line));
          node = std::move(e);
        } else {
          ExprPtr e = make_expr(ExprKind::kAttribute, line);
          e->name = expect_name();
          e->children.push_back(std::move(node));
          node = std::move(e);
        }
      } else if (at_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (at_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const int line = next().line;
    ExprPtr parts[3];
    int part = 0;
    bool slice = false;
    while (!at_op("]")) {
      if (at_op(":")) {
        next();
        slice = true;
        if (++part > 2) unexpected("']'");
        continue;
      }
      if (parts[part]) unexpected("':' or ']'");
      parts[part] = parse_expression(true);
    }
    next();
    if (!slice && !parts[0]) fail(name_, line, "an empty subscript");
    ExprPtr e = make_expr(slice ? ExprKind::kSlice : ExprKind::kItem, line);
    e->children.push_back(std::move(node));
    e->children.push_back(std::move(parts[0]));
    if (slice) {
      e->children.push_back(std::move(parts[1]));
      e->children.push_back(std::move(parts[2]));
    }
    return e;
  }

  // `(args)` after an expression, a filter or a test: positional then keyword arguments.
  void parse_arguments(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!at_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (at_op(")")) break;
      if (at_op("*") || at_op("**"))
        fail(name_, peek().line, "*args and **kwargs are not supported");
      if (peek().kind == TokenKind::kName && at_op("=", 1)) {
        std::string key = next().text;
        next();
        e.keywords.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.keywords.empty()) {
          fail(name_, peek().line, "a positional argument after a keyword argument");
        }
        e.children.push_back(parse_expression(true));
      }
    }
    next();
  }

  ExprPtr parse_call(ExprPtr node) {
    ExprPtr e = make_expr(ExprKind::kCall, peek().line);
    e->children.push_back(std::move(node));
    parse_arguments(*e);
    return e;
  }

  std::string dotted_name() {
    std::string name = expect_name();
    while (at_op(".")) {
      next();
      name += "." + expect_name();
    }
    return name;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (at_op("|")) {
        ExprPtr e = make_expr(ExprKind::kFilter, next().line);
        e->name = dotted_name();
        e->children.push_back(std::move(node));
        if (at_op("(")) parse_arguments(*e);
        node = std::move(e);
      } else if (at_name("is")) {
        node = parse_test(std::move(node));
      } else if (at_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_test(ExprPtr node) {
    ExprPtr e = make_expr(ExprKind::kTest, next().line);
    if (at_name("not")) {
      next();
      e->negated = true;
    }
    e->name = dotted_name();
    e->children.push_back(std::move(node));
    const TokenKind k = peek().kind;
    if (at_op("(")) {
      parse_arguments(*e);
    } else if ((k == TokenKind::kName || k == TokenKind::kString || k == TokenKind::kInteger ||
                k == TokenKind::kFloat || at_op("[") || at_op("{")) &&
               !at_name("else") && !at_name("or") && !at_name("and")) {
      if (at_name("is")) fail(name_, peek().line, "You cannot chain multiple tests with is");
      e->children.push_back(parse_postfix(parse_primary()));
    }
    return e;
  }

  std::vector<Token> tokens_;
  std::size_t i_ = 0;
  const std::string& name_;
  int depth_ = 0;
};

}  // namespace

Program parse_template(const std::string& source, const std::string& name) {
  Program program;
  program.name = name;
  program.body = Parser(lex(source, name), name).parse_all();
  return program;
}

}  // namespace numesh::models::chat
