// Runs a parsed template (template.h): jinja2's scoping (a for loop's body is a new scope each
// iteration, so `set` inside it does not leak; `if` is not a scope; a namespace's attributes are
// the way out), its loop variable, macros, and the bounds of Limits.
#include <unordered_map>

#include "gateway/jinja/lexer.h"
#include "gateway/jinja/parser.h"
#include "gateway/jinja/template.h"

namespace ferry::gateway::jinja {

namespace {

enum class Flow { kNormal, kBreak, kContinue };

class Interpreter {
 public:
  Interpreter(const Limits& limits, const Dict& variables) : limits_(limits) {
    frames_.emplace_back();
    const Dict globals = Globals(limits.values);
    for (const auto& [k, v] : globals.items()) frames_[0][k] = v;
    for (const auto& [k, v] : variables.items()) frames_[0][k] = v;
    outputs_.emplace_back();
  }

  std::string Run(const Body& body) {
    ExecBody(body);
    return std::move(outputs_.back());
  }

 private:
  void Step(int line) {
    if (++steps_ > limits_.max_steps) {
      throw Error{"the template ran past the template engine's limit of " + std::to_string(limits_.max_steps) + " steps",
                  line};
    }
  }

  void Emit(const std::string& text, int line) {
    std::string& out = outputs_.back();
    out += text;
    CheckLimit(out.size(), limits_.max_output_bytes, "the output", line);
  }

  Value Lookup(const std::string& name) const {
    for (size_t i = frames_.size(); i-- > base_;) {
      if (auto it = frames_[i].find(name); it != frames_[i].end()) return it->second;
    }
    if (base_ > 0) {  // a macro sees the template's top-level names
      if (auto it = frames_[0].find(name); it != frames_[0].end()) return it->second;
    }
    return Value::Undefined("'" + name + "' is undefined");
  }

  void Assign(const std::string& name, Value v) { frames_.back()[name] = std::move(v); }

  // Binds a for or set target list: one name takes the value, several unpack it.
  void Bind(const std::vector<std::string>& targets, const Value& v, int line) {
    if (targets.size() == 1) {
      Assign(targets[0], v);
      return;
    }
    const List items = Iterate(v, line);
    if (items.size() != targets.size()) {
      throw Error{(items.size() < targets.size() ? "not enough values to unpack (expected " : "too many values to unpack (expected ") +
                      std::to_string(targets.size()) + ", got " + std::to_string(items.size()) + ")",
                  line};
    }
    for (size_t i = 0; i < targets.size(); ++i) Assign(targets[i], items[i]);
  }

  Flow ExecBody(const Body& body) {
    for (const auto& s : body) {
      const Flow f = Exec(*s);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Flow Exec(const Stmt& s) {
    Step(s.line);
    switch (s.kind) {
      case Stmt::Kind::kText: Emit(s.text, s.line); return Flow::kNormal;
      case Stmt::Kind::kPrint: Emit(ToStr(Eval(*s.expr)), s.line); return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (size_t i = 0; i < s.conditions.size(); ++i) {
          if (Eval(*s.conditions[i]).Truthy()) return ExecBody(s.bodies[i]);
        }
        return s.bodies.size() > s.conditions.size() ? ExecBody(s.bodies.back()) : Flow::kNormal;
      case Stmt::Kind::kFor: return ExecFor(s);
      case Stmt::Kind::kSet: ExecSet(s); return Flow::kNormal;
      case Stmt::Kind::kSetBlock: {
        outputs_.emplace_back();
        const Flow f = ExecBody(s.bodies[0]);
        std::string text = std::move(outputs_.back());
        outputs_.pop_back();
        Assign(s.targets[0], Value::String(std::move(text)));
        return f;
      }
      case Stmt::Kind::kMacro: DefineMacro(s); return Flow::kNormal;
      case Stmt::Kind::kBreak: return Flow::kBreak;
      case Stmt::Kind::kContinue: return Flow::kContinue;
      case Stmt::Kind::kBlock: return ExecBody(s.bodies[0]);
    }
    return Flow::kNormal;
  }

  void ExecSet(const Stmt& s) {
    const Value v = Eval(*s.expr);
    if (s.ns_attr.empty()) {
      Bind(s.targets, v, s.line);
      return;
    }
    const Value ns = Lookup(s.targets[0]);
    if (ns.kind() != Value::Kind::kNamespace) {
      throw Error{"cannot assign attribute on non-namespace object", s.line};
    }
    if (v.holds_namespace()) {  // a cycle jinja2 would allow; no chat template needs one
      throw Error{"a namespace holding a namespace is not served by Ferry's template engine", s.line};
    }
    ns.mutable_namespace().Set(s.ns_attr, v);
  }

  // The loop variable of iteration i of n.
  static Value LoopValue(const List& items, size_t i) {
    const size_t n = items.size();
    Dict loop;
    loop.Set("index0", Value::Int(static_cast<int64_t>(i)));
    loop.Set("index", Value::Int(static_cast<int64_t>(i + 1)));
    loop.Set("revindex0", Value::Int(static_cast<int64_t>(n - i - 1)));
    loop.Set("revindex", Value::Int(static_cast<int64_t>(n - i)));
    loop.Set("first", Value::Bool(i == 0));
    loop.Set("last", Value::Bool(i + 1 == n));
    loop.Set("length", Value::Int(static_cast<int64_t>(n)));
    loop.Set("depth", Value::Int(1));
    loop.Set("depth0", Value::Int(0));
    loop.Set("previtem", i > 0 ? items[i - 1] : Value::Undefined("there is no previous item"));
    loop.Set("nextitem", i + 1 < n ? items[i + 1] : Value::Undefined("there is no next item"));
    loop.Set("cycle", Value::Callable("loop.cycle", [i](CallArgs& a) {
               if (a.positional.empty()) throw Error{"no items for cycling given", a.line};
               return a.positional[i % a.positional.size()];
             }));
    return Value::MakeDict(std::move(loop));
  }

  Flow ExecFor(const Stmt& s) {
    List items = Iterate(Eval(*s.expr), s.line);
    if (s.filter) {  // the filter sees each item bound to the targets; loop.length counts what passes
      List kept;
      for (const Value& item : items) {
        Step(s.line);
        frames_.emplace_back();
        Bind(s.targets, item, s.line);
        const bool keep = Eval(*s.filter).Truthy();
        frames_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    for (size_t i = 0; i < items.size(); ++i) {
      Step(s.line);
      frames_.emplace_back();
      Assign("loop", LoopValue(items, i));
      Bind(s.targets, items[i], s.line);
      const Flow f = ExecBody(s.bodies[0]);
      frames_.pop_back();
      if (f == Flow::kBreak) break;
    }
    if (items.empty() && s.bodies.size() > 1) return ExecBody(s.bodies[1]);
    return Flow::kNormal;
  }

  void DefineMacro(const Stmt& s) {
    const Stmt* macro = &s;
    Assign(s.name, Value::Callable(s.name, [this, macro](CallArgs& a) { return CallMacro(*macro, a); }));
  }

  Value CallMacro(const Stmt& m, CallArgs& a) {
    if (++call_depth_ > limits_.max_call_depth) {
      throw Error{"macros call each other deeper than the template engine's limit of " +
                      std::to_string(limits_.max_call_depth),
                  a.line};
    }
    if (a.positional.size() > m.targets.size()) {
      throw Error{"macro '" + m.name + "' takes not more than " + std::to_string(m.targets.size()) + " argument(s)", a.line};
    }
    const size_t saved_base = base_;
    frames_.emplace_back();
    base_ = frames_.size() - 1;
    for (size_t i = 0; i < m.targets.size(); ++i) {
      const Value* given = i < a.positional.size() ? &a.positional[i] : nullptr;
      for (const auto& [k, v] : a.keyword) {
        if (k == m.targets[i]) given = &v;
      }
      Assign(m.targets[i], given ? *given : m.defaults[i] ? Eval(*m.defaults[i])
                                                          : Value::Undefined("parameter '" + m.targets[i] + "' was not provided"));
    }
    for (const auto& [k, v] : a.keyword) {
      if (std::find(m.targets.begin(), m.targets.end(), k) == m.targets.end()) {
        throw Error{"macro '" + m.name + "' takes no keyword argument '" + k + "'", a.line};
      }
    }
    outputs_.emplace_back();
    ExecBody(m.bodies[0]);
    std::string text = std::move(outputs_.back());
    outputs_.pop_back();
    frames_.pop_back();
    base_ = saved_base;
    --call_depth_;
    return Value::String(std::move(text));
  }

  CallArgs EvalArgs(const Expr& e, size_t first) {
    CallArgs a;
    a.line = e.line;
    for (size_t i = first; i < e.args.size(); ++i) a.positional.push_back(Eval(*e.args[i]));
    for (const auto& [k, v] : e.kwargs) a.keyword.emplace_back(k, Eval(*v));
    return a;
  }

  Value Eval(const Expr& e) {
    Step(e.line);
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.value;
      case Expr::Kind::kName: return Lookup(e.name);
      case Expr::Kind::kAttr: return GetAttr(Eval(*e.args[0]), e.name, e.line);
      case Expr::Kind::kItem: return GetItem(Eval(*e.args[0]), Eval(*e.args[1]), e.line);
      case Expr::Kind::kSlice: {
        auto part = [&](size_t i) { return e.args[i] ? Eval(*e.args[i]) : Value::None(); };
        return GetSlice(Eval(*e.args[0]), part(1), part(2), part(3), e.line, limits_.values);
      }
      case Expr::Kind::kCall: {
        const Value callee = Eval(*e.args[0]);
        CallArgs a = EvalArgs(e, 1);
        if (callee.is_undefined()) throw Error{callee.str(), e.line};
        if (callee.kind() != Value::Kind::kCallable) {
          throw Error{std::string("'") + callee.TypeName() + "' object is not callable", e.line};
        }
        return callee.function()(a);
      }
      case Expr::Kind::kFilter: {
        const Value v = Eval(*e.args[0]);
        return ApplyFilter(e.name, v, EvalArgs(e, 1), limits_.values);
      }
      case Expr::Kind::kTest: {
        const Value v = Eval(*e.args[0]);
        return Value::Bool(ApplyTest(e.name, v, EvalArgs(e, 1)) != e.negated);
      }
      case Expr::Kind::kNot: return Value::Bool(!Eval(*e.args[0]).Truthy());
      case Expr::Kind::kNeg: return Negate(Eval(*e.args[0]), true, e.line);
      case Expr::Kind::kPos: return Negate(Eval(*e.args[0]), false, e.line);
      case Expr::Kind::kBinary: {
        const Value a = Eval(*e.args[0]);
        return BinaryOp(e.name, a, Eval(*e.args[1]), e.line, limits_.values);
      }
      case Expr::Kind::kAnd: {
        Value a = Eval(*e.args[0]);
        return a.Truthy() ? Eval(*e.args[1]) : a;
      }
      case Expr::Kind::kOr: {
        Value a = Eval(*e.args[0]);
        return a.Truthy() ? a : Eval(*e.args[1]);
      }
      case Expr::Kind::kCond:
        if (Eval(*e.args[1]).Truthy()) return Eval(*e.args[0]);
        return e.args[2] ? Eval(*e.args[2]) : Value::Undefined("the inline if-expression on line " + std::to_string(e.line) +
                                                                   " evaluated to false and no else section was defined.");
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        List items;
        for (const auto& a : e.args) items.push_back(Eval(*a));
        return e.kind == Expr::Kind::kTuple ? Value::MakeTuple(std::move(items)) : Value::MakeList(std::move(items));
      }
      case Expr::Kind::kDict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value key = Eval(*e.args[i]);
          if (!key.is_string()) throw Error{"dict keys other than strings are not served by Ferry's template engine", e.line};
          d.Set(key.str(), Eval(*e.args[i + 1]));
        }
        return Value::MakeDict(std::move(d));
      }
    }
    return Value();
  }

  const Limits& limits_;
  std::vector<std::unordered_map<std::string, Value>> frames_;
  size_t base_ = 0;  // the innermost macro's frame (0: none)
  std::vector<std::string> outputs_;
  int64_t steps_ = 0;
  int call_depth_ = 0;
};

}  // namespace

std::variant<Template, Error> Template::Parse(const std::string& source, Limits limits) {
  if (source.size() > limits.max_template_bytes) {
    return Error{"the template is " + std::to_string(source.size()) + " bytes, past the limit of " +
                 std::to_string(limits.max_template_bytes)};
  }
  auto tokens = Tokenize(source);
  if (auto* e = std::get_if<Error>(&tokens)) return *e;
  auto body = jinja::Parse(std::get<std::vector<Token>>(tokens), limits.max_nesting);
  if (auto* e = std::get_if<Error>(&body)) return *e;
  Template t;
  t.body_ = std::make_shared<const Body>(std::move(std::get<Body>(body)));
  t.limits_ = limits;
  return t;
}

std::variant<std::string, Error> Template::Render(const Dict& variables) const {
  try {
    return Interpreter(limits_, variables).Run(*body_);
  } catch (const Error& e) {
    return e;
  }
}

}  // namespace ferry::gateway::jinja
