#include "chat/jinja_interpreter.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "chat/jinja_filters.hpp"
#include "chat/jinja_objects.hpp"

namespace numesh::models::chat {

namespace {

// Macros calling macros deeper than this are refused (a template that recurses forever would
// otherwise overflow the stack).
constexpr int kMaxMacroDepth = 64;
// A render stops past this many statements and loop turns, or this much text, so that a template
// that would run for hours (nested ranges) or fill the memory fails instead.
constexpr std::int64_t kMaxSteps = 10'000'000;
constexpr std::size_t kMaxOutputBytes = std::size_t{64} << 20;

// Variables of one scope; lookups walk out to the globals.
struct Scope {
  DictObject vars;
  std::shared_ptr<Scope> parent;
};
using ScopePtr = std::shared_ptr<Scope>;

ScopePtr child_of(const ScopePtr& parent) {
  auto scope = std::make_shared<Scope>();
  scope->parent = parent;
  return scope;
}

enum class Flow { kNext, kBreak, kContinue };

class Interpreter {
 public:
  explicit Interpreter(const Program& program) : program_(program) {}

  std::string render(const Value& variables) {
    auto globals = std::make_shared<Scope>();
    globals->vars = *make_globals().dict();
    ScopePtr top = child_of(globals);
    top->vars = *variables.dict();
    std::string out;
    if (run(program_.body, top, out) != Flow::kNext) {
      fail(program_.name, 0, "break or continue outside a for loop");
    }
    return out;
  }

 private:
  [[noreturn]] void fail_at(int line, const std::string& message) const {
    fail(program_.name, line, message);
  }

  static Value lookup(const ScopePtr& scope, const std::string& name) {
    for (const Scope* s = scope.get(); s != nullptr; s = s->parent.get()) {
      if (const Value* v = s->vars.find(name)) return *v;
    }
    return Undefined{fmt::format("'{}' is undefined", name)};
  }

  // ---- statements ----------------------------------------------------------------------------
  Flow run(const Body& body, const ScopePtr& scope, std::string& out) {
    for (const Node& node : body) {
      const Flow flow = run_node(node, scope, out);
      if (flow != Flow::kNext) return flow;
    }
    return Flow::kNext;
  }

  void count_step(int line) {
    if (++steps_ > kMaxSteps) {
      fail_at(line, fmt::format("the template ran past {} steps", kMaxSteps));
    }
  }

  Flow run_node(const Node& node, const ScopePtr& scope, std::string& out) {
    count_step(node.line);
    if (out.size() > kMaxOutputBytes) {
      fail_at(node.line, fmt::format("the template wrote more than {} MiB", kMaxOutputBytes >> 20));
    }
    switch (node.kind) {
      case NodeKind::kText:
        out += node.text;
        return Flow::kNext;
      case NodeKind::kOutput:
        out += to_str(eval(*node.expr, scope));
        return Flow::kNext;
      case NodeKind::kIf:
        for (const auto& [condition, body] : node.branches) {
          if (truthy(eval(*condition, scope))) return run(body, scope, out);
        }
        return run(node.else_body, scope, out);
      case NodeKind::kFor:
        run_for(node, scope, out);
        return Flow::kNext;
      case NodeKind::kSet:
        assign(node, eval(*node.expr, scope), scope);
        return Flow::kNext;
      case NodeKind::kSetBlock: {
        std::string text;
        run(node.body, child_of(scope), text);
        scope->vars.set(node.targets[0], std::move(text));
        return Flow::kNext;
      }
      case NodeKind::kMacro:
        define_macro(node, scope);
        return Flow::kNext;
      case NodeKind::kWith: {
        ScopePtr inner = child_of(scope);
        for (const auto& [target, value] : node.params) {
          inner->vars.set(target, eval(*value, scope));
        }
        return run(node.body, inner, out);
      }
      case NodeKind::kBreak:
        return Flow::kBreak;
      case NodeKind::kContinue:
        return Flow::kContinue;
      case NodeKind::kBlock:
        return run(node.body, scope, out);
    }
    return Flow::kNext;
  }

  // Binds `targets` to `value` in `scope`, unpacking a sequence over several names.
  void bind(const Node& node, const std::vector<std::string>& targets, const Value& value,
            Scope& scope) const {
    if (targets.size() == 1) {
      scope.vars.set(targets[0], value);
      return;
    }
    std::vector<Value> items;
    try {
      items = iterate(value);
    } catch (const EvalError&) {
      fail_at(node.line, fmt::format("cannot unpack non-iterable {} object", type_name(value)));
    }
    if (items.size() != targets.size()) {
      fail_at(node.line,
              items.size() > targets.size()
                  ? fmt::format("too many values to unpack (expected {})", targets.size())
                  : fmt::format("not enough values to unpack (expected {}, got {})", targets.size(),
                                items.size()));
    }
    for (std::size_t i = 0; i < targets.size(); ++i) scope.vars.set(targets[i], items[i]);
  }

  void assign(const Node& node, const Value& value, const ScopePtr& scope) {
    if (node.attribute.empty()) {
      bind(node, node.targets, value, *scope);
      return;
    }
    const Value target = lookup(scope, node.targets[0]);
    if (!target.is_namespace()) {
      fail_at(node.line, "cannot assign attribute on non-namespace object");
    }
    std::get<Namespace>(target.v)->attributes.set(node.attribute, value);
  }

  // The items a for loop visits: its iterable's, less those its `if` filters out.
  std::vector<Value> loop_items(const Node& node, const ScopePtr& scope) {
    std::vector<Value> items;
    const Value iterable = eval(*node.expr, scope);
    try {
      items = iterate(iterable);
    } catch (const EvalError& e) {
      fail_at(node.line, e.what());
    }
    if (!node.filter) return items;
    std::vector<Value> kept;
    for (const Value& item : items) {
      ScopePtr probe = child_of(scope);
      bind(node, node.targets, item, *probe);
      if (truthy(eval(*node.filter, probe))) kept.push_back(item);
    }
    return kept;
  }

  static Value loop_object(const std::vector<Value>& items, std::size_t i) {
    const auto n = static_cast<std::int64_t>(items.size());
    const auto k = static_cast<std::int64_t>(i);
    std::vector<std::pair<Value, Value>> fields = {
        {"index", k + 1},  {"index0", k},        {"revindex", n - k}, {"revindex0", n - k - 1},
        {"first", k == 0}, {"last", k == n - 1}, {"length", n},       {"depth", 1},
        {"depth0", 0}};
    if (i > 0) fields.emplace_back("previtem", items[i - 1]);
    if (i + 1 < items.size()) fields.emplace_back("nextitem", items[i + 1]);
    fields.emplace_back("cycle", make_callable("cycle", [k](CallArgs& a) -> Value {
                          if (a.positional.empty()) throw EvalError("no items for cycling given");
                          return a.positional[static_cast<std::size_t>(k) % a.positional.size()];
                        }));
    return make_dict(std::move(fields));
  }

  void run_for(const Node& node, const ScopePtr& scope, std::string& out) {
    const std::vector<Value> items = loop_items(node, scope);
    for (std::size_t i = 0; i < items.size(); ++i) {
      count_step(node.line);
      ScopePtr iteration = child_of(scope);
      bind(node, node.targets, items[i], *iteration);
      iteration->vars.set("loop", loop_object(items, i));
      if (run(node.body, iteration, out) == Flow::kBreak) break;
    }
    if (items.empty()) run(node.else_body, scope, out);
  }

  void define_macro(const Node& node, const ScopePtr& scope) {
    const Node* macro = &node;
    // The macro sees the scope it was defined in (weakly: it lives in that scope itself).
    std::weak_ptr<Scope> weak = scope;
    Value callable = make_callable(
        node.text,
        [this, macro, weak](CallArgs& args) -> Value {
          ScopePtr inner = child_of(weak.lock());
          bind_parameters(*macro, args, inner);
          if (++macro_depth_ > kMaxMacroDepth) {
            macro_depth_ = 0;
            fail_at(macro->line, fmt::format("macro '{}' calls itself deeper than {} times",
                                             macro->text, kMaxMacroDepth));
          }
          std::string text;
          run(macro->body, inner, text);
          --macro_depth_;
          return text;
        },
        /*macro=*/true);
    scope->vars.set(node.text, std::move(callable));
  }

  void bind_parameters(const Node& macro, CallArgs& args, const ScopePtr& inner) {
    const auto& params = macro.params;
    if (args.positional.size() > params.size()) {
      throw EvalError(
          fmt::format("macro '{}' takes not more than {} argument(s)", macro.text, params.size()));
    }
    for (const auto& keyword : args.keyword) {
      const std::string& key = keyword.first;  // a name of its own: lambdas capture it (clang 14)
      const bool known =
          std::any_of(params.begin(), params.end(), [&](const auto& p) { return p.first == key; });
      if (!known) {
        throw EvalError(fmt::format("macro '{}' takes no keyword argument '{}'", macro.text, key));
      }
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto& [name, default_value] = params[i];
      Value value = argument(args, i, name);
      if (value.undefined() && default_value) value = eval(*default_value, inner);
      if (value.undefined()) {
        value = Undefined{fmt::format("parameter '{}' was not provided", name)};
      }
      inner->vars.set(name, value);
    }
  }

  // ---- expressions ---------------------------------------------------------------------------
  Value eval(const Expr& e, const ScopePtr& scope) {
    try {
      return eval_node(e, scope);
    } catch (const EvalError& error) {
      fail_at(e.line, error.what());
    }
  }

  CallArgs arguments(const Expr& e, const ScopePtr& scope) {
    CallArgs args;
    for (std::size_t i = 1; i < e.children.size(); ++i) {
      args.positional.push_back(eval(*e.children[i], scope));
    }
    for (const auto& [key, value] : e.keywords) args.keyword.emplace_back(key, eval(*value, scope));
    return args;
  }

  Value eval_node(const Expr& e, const ScopePtr& scope) {
    switch (e.kind) {
      case ExprKind::kLiteral:
        return e.literal;
      case ExprKind::kName:
        return lookup(scope, e.name);
      case ExprKind::kList:
      case ExprKind::kTuple: {
        std::vector<Value> items;
        for (const auto& child : e.children) items.push_back(eval(*child, scope));
        return make_list(std::move(items), e.kind == ExprKind::kTuple);
      }
      case ExprKind::kDict:
        return eval_dict(e, scope);
      case ExprKind::kAttribute:
        return get_attribute(eval(*e.children[0], scope), e.name);
      case ExprKind::kItem:
        return get_item(eval(*e.children[0], scope), eval(*e.children[1], scope));
      case ExprKind::kSlice: {
        const auto part = [&](std::size_t i) {
          return e.children[i] ? eval(*e.children[i], scope) : Value(None{});
        };
        return get_slice(eval(*e.children[0], scope), part(1), part(2), part(3));
      }
      case ExprKind::kCall: {
        const Value callee = eval(*e.children[0], scope);
        CallArgs args = arguments(e, scope);
        return call(callee, args);
      }
      case ExprKind::kFilter: {
        const Value value = eval(*e.children[0], scope);
        CallArgs args = arguments(e, scope);
        return apply_filter(e.name, value, args);
      }
      case ExprKind::kTest: {
        const Value value = eval(*e.children[0], scope);
        CallArgs args = arguments(e, scope);
        return apply_test(e.name, value, args) != e.negated;
      }
      case ExprKind::kUnary:
        return eval_unary(e, scope);
      case ExprKind::kBinary:
        return eval_binary(e, scope);
      case ExprKind::kCompare: {
        Value left = eval(*e.children[0], scope);
        for (std::size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.children[i + 1], scope);
          if (!compare(e.ops[i], left, right)) return false;
          left = std::move(right);
        }
        return true;
      }
      case ExprKind::kCondition:
        if (truthy(eval(*e.children[1], scope))) return eval(*e.children[0], scope);
        if (e.children[2]) return eval(*e.children[2], scope);
        return Undefined{"the conditional expression evaluated to false and had no else"};
    }
    return Undefined{};
  }

  Value eval_dict(const Expr& e, const ScopePtr& scope) {
    auto dict = std::make_shared<DictObject>();
    for (std::size_t i = 0; i + 1 < e.children.size(); i += 2) {
      const Value key = eval(*e.children[i], scope);
      if (key.is_list() || key.is_dict() || key.is_namespace() || key.undefined()) {
        throw EvalError(fmt::format("unhashable type: '{}'", type_name(key)));
      }
      dict->set(key, eval(*e.children[i + 1], scope));
    }
    return Value(dict);
  }

  Value eval_unary(const Expr& e, const ScopePtr& scope) {
    const Value v = eval(*e.children[0], scope);
    if (e.name == "not") return !truthy(v);
    if (v.undefined()) fail_undefined(v);
    if (v.is_float()) return e.name == "-" ? -std::get<double>(v.v) : std::get<double>(v.v);
    if (v.is_int() || v.is_bool()) {
      const std::int64_t i = as_int(v, "an operand");
      return e.name == "-" ? binary_op("-", 0, i) : Value(i);
    }
    throw EvalError(fmt::format("bad operand type for unary {}: '{}'", e.name, type_name(v)));
  }

  Value eval_binary(const Expr& e, const ScopePtr& scope) {
    Value left = eval(*e.children[0], scope);
    if (e.name == "and") return truthy(left) ? eval(*e.children[1], scope) : left;
    if (e.name == "or") return truthy(left) ? left : eval(*e.children[1], scope);
    return binary_op(e.name, left, eval(*e.children[1], scope));
  }

  const Program& program_;
  int macro_depth_ = 0;
  std::int64_t steps_ = 0;
};

// jinja2 refuses an unknown filter or test when it compiles the template, except inside an if
// (its condition and branches) or a conditional expression, where it fails only when run; a
// for, macro, with or set block starts a strict scope again.
void check_expr(const Program& program, const Expr* e, bool soft) {
  if (e == nullptr) return;
  if (!soft && e->kind == ExprKind::kFilter && !has_filter(e->name)) {
    fail(program.name, e->line, fmt::format("No filter named '{}'.", e->name));
  }
  if (!soft && e->kind == ExprKind::kTest && !has_test(e->name)) {
    fail(program.name, e->line, fmt::format("No test named '{}'.", e->name));
  }
  const bool inner_soft = soft || e->kind == ExprKind::kCondition;
  for (const auto& child : e->children) check_expr(program, child.get(), inner_soft);
  for (const auto& [key, value] : e->keywords) check_expr(program, value.get(), inner_soft);
}

void check_body(const Program& program, const Body& body, bool soft) {
  for (const Node& node : body) {
    const bool strict_scope = node.kind == NodeKind::kFor || node.kind == NodeKind::kMacro ||
                              node.kind == NodeKind::kWith || node.kind == NodeKind::kSetBlock;
    const bool inner = strict_scope ? false : soft;
    check_expr(program, node.expr.get(), soft);
    check_expr(program, node.filter.get(), inner);
    for (const auto& [condition, branch] : node.branches) {
      check_expr(program, condition.get(), true);
      check_body(program, branch, true);
    }
    for (const auto& [name, value] : node.params) {
      check_expr(program, value.get(), node.kind == NodeKind::kMacro ? false : soft);
    }
    check_body(program, node.body, inner);
    check_body(program, node.else_body, node.kind == NodeKind::kIf ? true : inner);
  }
}

}  // namespace

void check_names(const Program& program) { check_body(program, program.body, false); }

std::string render(const Program& program, const Value& variables) {
  return Interpreter(program).render(variables);
}

}  // namespace numesh::models::chat
