#include "gateway/jinja/parser.h"

#include <algorithm>
#include <charconv>
#include <set>

#include "gateway/jinja/builtins.h"

namespace ferry::gateway::jinja {

namespace {

using TK = Token::Kind;

ExprPtr MakeExpr(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, int max_depth) : tokens_(tokens), max_depth_(max_depth) {}

  Body Template() {
    std::string end;
    Body body = ParseBody({}, &end);
    return body;
  }

 private:
  // Depth of the parser's recursion, bounded so that a hostile template cannot exhaust the stack.
  struct DepthGuard {
    explicit DepthGuard(Parser* p) : p(p) {
      if (++p->depth_ > p->max_depth_) {
        throw Error{"the template nests deeper than " + std::to_string(p->max_depth_) + " levels", p->Cur().line};
      }
    }
    ~DepthGuard() { --p->depth_; }
    Parser* p;
  };

  const Token& Cur() const { return tokens_[pos_]; }
  const Token& Peek(size_t ahead = 1) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  const Token& Next() { return tokens_[pos_ < tokens_.size() - 1 ? pos_++ : pos_]; }
  bool IsOp(const char* op) const { return Cur().kind == TK::kOp && Cur().text == op; }
  bool IsName(const char* name) const { return Cur().kind == TK::kName && Cur().text == name; }
  bool SkipOp(const char* op) {
    if (!IsOp(op)) return false;
    ++pos_;
    return true;
  }
  bool SkipName(const char* name) {
    if (!IsName(name)) return false;
    ++pos_;
    return true;
  }
  [[noreturn]] void Fail(const std::string& message) const { throw Error{message, Cur().line}; }

  // A composite expression complete: its depth from its children's, bounded so that neither
  // evaluating nor freeing the tree recurses without limit (a chain such as 1+1+1+... is built by
  // a loop, not by the parser's recursion, so the DepthGuard alone does not see it).
  ExprPtr Finish(ExprPtr e) {
    int deepest = 0;
    for (const auto& a : e->args) {
      if (a) deepest = std::max(deepest, a->depth);
    }
    for (const auto& [k, a] : e->kwargs) deepest = std::max(deepest, a->depth);
    e->depth = deepest + 1;
    if (e->depth > 4 * max_depth_) {
      throw Error{"an expression nests deeper than " + std::to_string(4 * max_depth_) + " levels", e->line};
    }
    return e;
  }
  std::string Describe(const Token& t) const {
    switch (t.kind) {
      case TK::kBlockEnd: return "end of statement block";
      case TK::kVarEnd: return "end of print statement";
      case TK::kEof: return "end of template";
      case TK::kString: return "string";
      default: return "'" + t.text + "'";
    }
  }
  void ExpectOp(const char* op) {
    if (!SkipOp(op)) Fail(std::string("expected '") + op + "', got " + Describe(Cur()));
  }
  void ExpectBlockEnd() {
    if (Cur().kind != TK::kBlockEnd) Fail("expected end of statement block, got " + Describe(Cur()));
    ++pos_;
  }
  std::string ExpectName() {
    if (Cur().kind != TK::kName) Fail("expected a name, got " + Describe(Cur()));
    return Next().text;
  }

  // Statements until one of `ends` ({% endfor %}, ...), whose name goes to *end (the tag's
  // block-begin and name consumed; the caller reads the rest of it).
  Body ParseBody(const std::set<std::string>& ends, std::string* end) {
    DepthGuard guard(this);
    Body body;
    while (true) {
      const Token& t = Cur();
      if (t.kind == TK::kEof) {
        if (ends.empty()) return body;
        Fail("unexpected end of template; expected " + Join(ends));
      }
      if (t.kind == TK::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        ++pos_;
      } else if (t.kind == TK::kVarBegin) {
        ++pos_;
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kPrint;
        s->line = t.line;
        s->expr = ParseTuple(true);
        if (Cur().kind != TK::kVarEnd) Fail("expected end of print statement, got " + Describe(Cur()));
        ++pos_;
        body.push_back(std::move(s));
      } else if (t.kind == TK::kBlockBegin) {
        ++pos_;
        const std::string name = Cur().kind == TK::kName ? Cur().text : "";
        if (ends.count(name)) {
          ++pos_;
          *end = name;
          return body;
        }
        body.push_back(ParseStatement());
      } else {
        Fail("unexpected " + Describe(t));
      }
    }
  }

  static std::string Join(const std::set<std::string>& names) {
    std::string out;
    for (const auto& n : names) out += (out.empty() ? "'" : " or '") + n + "'";
    return out;
  }

  std::unique_ptr<Stmt> NewStmt(Stmt::Kind kind) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = Cur().line;
    return s;
  }

  std::unique_ptr<Stmt> ParseStatement() {
    if (Cur().kind != TK::kName) Fail("tag name expected");
    const std::string name = Cur().text;
    if (name == "if") return ParseIf();
    if (name == "for") return ParseFor();
    if (name == "set") return ParseSet();
    if (name == "macro") return ParseMacro();
    if (name == "generation") {  // transformers' tag marking the assistant's tokens: its body as is
      auto s = NewStmt(Stmt::Kind::kBlock);
      ++pos_;
      ExpectBlockEnd();
      std::string end;
      s->bodies.push_back(ParseBody({"endgeneration"}, &end));
      ExpectBlockEnd();
      return s;
    }
    if (name == "break" || name == "continue") {
      if (loops_ == 0) Fail("'" + name + "' outside of a loop");
      auto s = NewStmt(name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue);
      ++pos_;
      ExpectBlockEnd();
      return s;
    }
    static const std::set<std::string> kEnds = {"endif", "endfor", "endset", "endmacro", "elif", "else", "endgeneration"};
    if (kEnds.count(name)) Fail("unexpected '" + name + "'");
    Fail("the statement '{% " + name + " %}' is not served by Ferry's template engine (served: if, for, set, macro, "
         "break, continue, generation)");
  }

  std::unique_ptr<Stmt> ParseIf() {
    auto s = NewStmt(Stmt::Kind::kIf);
    ++pos_;
    while (true) {
      s->conditions.push_back(ParseTuple(false, true));
      ExpectBlockEnd();
      std::string end;
      s->bodies.push_back(ParseBody({"elif", "else", "endif"}, &end));
      if (end == "elif") continue;
      if (end == "else") {
        ExpectBlockEnd();
        s->bodies.push_back(ParseBody({"endif"}, &end));
      }
      ExpectBlockEnd();
      return s;
    }
  }

  // for-loop and set targets: names, comma separated, optionally in parentheses.
  std::vector<std::string> ParseTargets() {
    std::vector<std::string> names;
    const bool paren = SkipOp("(");
    do {
      names.push_back(ExpectName());
    } while (SkipOp(",") && Cur().kind == TK::kName);
    if (paren) ExpectOp(")");
    return names;
  }

  std::unique_ptr<Stmt> ParseFor() {
    auto s = NewStmt(Stmt::Kind::kFor);
    ++pos_;
    s->targets = ParseTargets();
    if (!SkipName("in")) Fail("expected 'in', got " + Describe(Cur()));
    s->expr = ParseTuple(false, false);  // no conditional expression: `if` filters the loop
    if (SkipName("if")) s->filter = ParseExpression(true);
    if (IsName("recursive")) Fail("recursive loops are not served by Ferry's template engine");
    ExpectBlockEnd();
    ++loops_;
    std::string end;
    s->bodies.push_back(ParseBody({"endfor", "else"}, &end));
    --loops_;
    if (end == "else") {
      ExpectBlockEnd();
      s->bodies.push_back(ParseBody({"endfor"}, &end));
    }
    ExpectBlockEnd();
    return s;
  }

  std::unique_ptr<Stmt> ParseSet() {
    auto s = NewStmt(Stmt::Kind::kSet);
    ++pos_;
    if (Cur().kind == TK::kName && Peek().kind == TK::kOp && Peek().text == ".") {  // set ns.attr = ...
      s->targets.push_back(Next().text);
      ++pos_;
      s->ns_attr = ExpectName();
    } else {
      s->targets = ParseTargets();
    }
    if (SkipOp("=")) {
      s->expr = ParseTuple(true);
      ExpectBlockEnd();
      return s;
    }
    if (s->targets.size() != 1 || !s->ns_attr.empty()) Fail("expected '=', got " + Describe(Cur()));
    if (IsOp("|")) Fail("a filter on a block set is not served by Ferry's template engine");
    ExpectBlockEnd();
    s->kind = Stmt::Kind::kSetBlock;
    std::string end;
    s->bodies.push_back(ParseBody({"endset"}, &end));
    ExpectBlockEnd();
    return s;
  }

  std::unique_ptr<Stmt> ParseMacro() {
    auto s = NewStmt(Stmt::Kind::kMacro);
    ++pos_;
    s->name = ExpectName();
    ExpectOp("(");
    while (!SkipOp(")")) {
      if (!s->targets.empty()) ExpectOp(",");
      if (SkipOp(")")) break;
      s->targets.push_back(ExpectName());
      s->defaults.push_back(SkipOp("=") ? ParseExpression(true) : nullptr);
    }
    ExpectBlockEnd();
    std::string end;
    const int loops = loops_;
    loops_ = 0;  // a break in a macro does not reach the caller's loop
    s->bodies.push_back(ParseBody({"endmacro"}, &end));
    loops_ = loops;
    if (Cur().kind == TK::kName && Cur().text == s->name) ++pos_;
    ExpectBlockEnd();
    return s;
  }

  // An expression, or several separated by commas: a tuple (jinja2's parse_tuple).
  ExprPtr ParseTuple(bool with_condexpr, bool explicit_only = false) {
    const int line = Cur().line;
    ExprPtr first = ParseExpression(with_condexpr);
    if (explicit_only || !IsOp(",")) return first;
    auto t = MakeExpr(Expr::Kind::kTuple, line);
    t->args.push_back(std::move(first));
    while (SkipOp(",")) {
      if (Cur().kind == TK::kBlockEnd || Cur().kind == TK::kVarEnd || IsOp(")")) break;
      t->args.push_back(ParseExpression(with_condexpr));
    }
    return Finish(std::move(t));
  }

  ExprPtr ParseExpression(bool with_condexpr) {
    DepthGuard guard(this);
    ExprPtr e = ParseOr();
    if (!with_condexpr) return e;
    while (IsName("if")) {
      const int line = Next().line;
      auto c = MakeExpr(Expr::Kind::kCond, line);
      c->args.push_back(std::move(e));
      c->args.push_back(ParseOr());
      c->args.push_back(SkipName("else") ? ParseExpression(true) : nullptr);
      e = Finish(std::move(c));
    }
    return e;
  }

  ExprPtr Binary(Expr::Kind kind, const std::string& op, ExprPtr a, ExprPtr b, int line) {
    auto e = MakeExpr(kind, line);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return Finish(std::move(e));
  }

  ExprPtr ParseOr() {
    ExprPtr e = ParseAnd();
    while (IsName("or")) {
      const int line = Next().line;
      e = Binary(Expr::Kind::kOr, "or", std::move(e), ParseAnd(), line);
    }
    return e;
  }

  ExprPtr ParseAnd() {
    ExprPtr e = ParseNot();
    while (IsName("and")) {
      const int line = Next().line;
      e = Binary(Expr::Kind::kAnd, "and", std::move(e), ParseNot(), line);
    }
    return e;
  }

  ExprPtr ParseNot() {
    if (IsName("not")) {
      DepthGuard guard(this);
      auto e = MakeExpr(Expr::Kind::kNot, Next().line);
      e->args.push_back(ParseNot());
      return Finish(std::move(e));
    }
    return ParseCompare();
  }

  // One comparison: a chain (a < b < c) is refused rather than evaluated differently from Python.
  ExprPtr ParseCompare() {
    ExprPtr e = ParseMath1();
    bool compared = false;
    while (true) {
      const int line = Cur().line;
      std::string op;
      if (Cur().kind == TK::kOp && (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" ||
                                    Cur().text == ">" || Cur().text == "<=" || Cur().text == ">=")) {
        op = Next().text;
      } else if (SkipName("in")) {
        op = "in";
      } else if (IsName("not") && Peek().kind == TK::kName && Peek().text == "in") {
        pos_ += 2;
        op = "notin";
      } else {
        return e;
      }
      if (compared) Fail("chained comparisons (a < b < c) are not served by Ferry's template engine");
      compared = true;
      e = Binary(Expr::Kind::kBinary, op, std::move(e), ParseMath1(), line);
    }
  }

  ExprPtr ParseMath1() {
    ExprPtr e = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      const Token& t = Next();
      e = Binary(Expr::Kind::kBinary, t.text, std::move(e), ParseConcat(), t.line);
    }
    return e;
  }

  ExprPtr ParseConcat() {
    ExprPtr e = ParseMath2();
    while (IsOp("~")) {
      const int line = Next().line;
      e = Binary(Expr::Kind::kBinary, "~", std::move(e), ParseMath2(), line);
    }
    return e;
  }

  ExprPtr ParseMath2() {
    ExprPtr e = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token& t = Next();
      e = Binary(Expr::Kind::kBinary, t.text, std::move(e), ParsePow(), t.line);
    }
    return e;
  }

  ExprPtr ParsePow() {
    ExprPtr e = ParseUnary(true);
    while (IsOp("**")) {
      const int line = Next().line;
      e = Binary(Expr::Kind::kBinary, "**", std::move(e), ParseUnary(true), line);
    }
    return e;
  }

  ExprPtr ParseUnary(bool with_filter) {
    DepthGuard guard(this);
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      const Token& t = Next();
      e = MakeExpr(t.text == "-" ? Expr::Kind::kNeg : Expr::Kind::kPos, t.line);
      e->args.push_back(ParseUnary(false));
      e = Finish(std::move(e));
    } else {
      e = ParsePrimary();
    }
    e = ParsePostfix(std::move(e));
    if (with_filter) e = ParseFilterExpr(std::move(e));
    return e;
  }

  ExprPtr ParsePrimary() {
    const Token& t = Cur();
    switch (t.kind) {
      case TK::kName: {
        ++pos_;
        if (t.text == "true" || t.text == "True") return Literal(Value::Bool(true), t.line);
        if (t.text == "false" || t.text == "False") return Literal(Value::Bool(false), t.line);
        if (t.text == "none" || t.text == "None") return Literal(Value::None(), t.line);
        auto e = MakeExpr(Expr::Kind::kName, t.line);
        e->name = t.text;
        return e;
      }
      case TK::kString: {
        std::string s;
        while (Cur().kind == TK::kString) s += Next().text;  // adjacent literals join
        return Literal(Value::String(std::move(s)), t.line);
      }
      case TK::kInt: {
        ++pos_;
        int64_t v = 0;
        const auto res = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (res.ec != std::errc()) Fail("the integer " + t.text + " is past 64 bits, which Ferry does not serve");
        return Literal(Value::Int(v), t.line);
      }
      case TK::kFloat: {
        ++pos_;
        return Literal(Value::Float(std::strtod(t.text.c_str(), nullptr)), t.line);
      }
      case TK::kOp:
        if (t.text == "(") return ParseParen();
        if (t.text == "[") return ParseList();
        if (t.text == "{") return ParseDict();
        [[fallthrough]];
      default: Fail("unexpected " + Describe(t));
    }
  }

  ExprPtr Literal(Value v, int line) {
    auto e = MakeExpr(Expr::Kind::kLiteral, line);
    e->value = std::move(v);
    return e;
  }

  ExprPtr ParseParen() {
    const int line = Next().line;
    if (SkipOp(")")) return MakeExpr(Expr::Kind::kTuple, line);
    ExprPtr first = ParseExpression(true);
    if (SkipOp(")")) return first;
    auto t = MakeExpr(Expr::Kind::kTuple, line);
    t->args.push_back(std::move(first));
    while (SkipOp(",")) {
      if (IsOp(")")) break;
      t->args.push_back(ParseExpression(true));
    }
    ExpectOp(")");
    return Finish(std::move(t));
  }

  ExprPtr ParseList() {
    auto e = MakeExpr(Expr::Kind::kList, Next().line);
    while (!SkipOp("]")) {
      if (!e->args.empty()) ExpectOp(",");
      if (SkipOp("]")) break;
      e->args.push_back(ParseExpression(true));
    }
    return Finish(std::move(e));
  }

  ExprPtr ParseDict() {
    auto e = MakeExpr(Expr::Kind::kDict, Next().line);
    while (!SkipOp("}")) {
      if (!e->args.empty()) ExpectOp(",");
      if (SkipOp("}")) break;
      e->args.push_back(ParseExpression(true));
      ExpectOp(":");
      e->args.push_back(ParseExpression(true));
    }
    return Finish(std::move(e));
  }

  ExprPtr ParsePostfix(ExprPtr e) {
    while (true) {
      if (IsOp(".")) {
        const int line = Next().line;
        if (Cur().kind == TK::kInt) {  // x.0 is x[0]
          auto item = MakeExpr(Expr::Kind::kItem, line);
          item->args.push_back(std::move(e));
          item->args.push_back(ParsePrimary());
          e = Finish(std::move(item));
          continue;
        }
        auto attr = MakeExpr(Expr::Kind::kAttr, line);
        attr->name = ExpectName();
        attr->args.push_back(std::move(e));
        e = Finish(std::move(attr));
      } else if (IsOp("[")) {
        e = ParseSubscript(std::move(e));
      } else if (IsOp("(")) {
        e = ParseCall(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr ParseSubscript(ExprPtr e) {
    DepthGuard guard(this);
    const int line = Next().line;
    ExprPtr parts[3];
    int colons = 0;
    while (!IsOp("]")) {
      if (SkipOp(":")) {
        if (++colons > 2) Fail("expected ']'");
        continue;
      }
      if (parts[colons]) Fail("expected ':' or ']', got " + Describe(Cur()));
      parts[colons] = ParseExpression(true);
    }
    ++pos_;
    if (colons == 0 && !parts[0]) Fail("expected an index");
    auto s = MakeExpr(colons == 0 ? Expr::Kind::kItem : Expr::Kind::kSlice, line);
    s->args.push_back(std::move(e));
    for (int i = 0; i <= (colons == 0 ? 0 : 2); ++i) s->args.push_back(std::move(parts[i]));
    return Finish(std::move(s));
  }

  // (args..., name=value...) after a callee, a filter or a test; into e's args and kwargs.
  void ParseCallArgs(Expr& e) {
    ExpectOp("(");
    bool first = true;
    while (!SkipOp(")")) {
      if (!first) ExpectOp(",");
      first = false;
      if (SkipOp(")")) break;
      if (IsOp("*") || IsOp("**")) Fail("*args and **kwargs in calls are not served by Ferry's template engine");
      if (Cur().kind == TK::kName && Peek().kind == TK::kOp && Peek().text == "=") {
        std::string key = Next().text;
        ++pos_;
        e.kwargs.emplace_back(std::move(key), ParseExpression(true));
      } else {
        if (!e.kwargs.empty()) Fail("a positional argument follows a keyword argument");
        e.args.push_back(ParseExpression(true));
      }
    }
  }

  ExprPtr ParseCall(ExprPtr callee) {
    DepthGuard guard(this);
    auto c = MakeExpr(Expr::Kind::kCall, Cur().line);
    c->args.push_back(std::move(callee));
    ParseCallArgs(*c);
    return Finish(std::move(c));
  }

  ExprPtr ParseFilterExpr(ExprPtr e) {
    while (true) {
      if (IsOp("|")) {
        const int line = Next().line;
        auto f = MakeExpr(Expr::Kind::kFilter, line);
        f->name = ExpectName();
        while (IsOp(".")) {  // dotted filter names
          ++pos_;
          f->name += "." + ExpectName();
        }
        if (!IsKnownFilter(f->name)) {
          throw Error{"the filter '" + f->name + "' is not served by Ferry's template engine", line};
        }
        f->args.push_back(std::move(e));
        if (IsOp("(")) ParseCallArgs(*f);
        e = Finish(std::move(f));
      } else if (IsName("is")) {
        e = ParseTest(std::move(e));
      } else if (IsOp("(")) {
        e = ParseCall(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr ParseTest(ExprPtr e) {
    const int line = Next().line;
    auto t = MakeExpr(Expr::Kind::kTest, line);
    t->negated = SkipName("not");
    t->name = ExpectName();
    while (IsOp(".")) {
      ++pos_;
      t->name += "." + ExpectName();
    }
    if (!IsKnownTest(t->name)) throw Error{"the test '" + t->name + "' is not served by Ferry's template engine", line};
    t->args.push_back(std::move(e));
    if (IsOp("(")) {
      ParseCallArgs(*t);
    } else if ((Cur().kind == TK::kName || Cur().kind == TK::kString || Cur().kind == TK::kInt ||
                Cur().kind == TK::kFloat || IsOp("[") || IsOp("{")) &&
               !(IsName("else") || IsName("or") || IsName("and"))) {
      if (IsName("is")) Fail("You cannot chain multiple tests with is");
      t->args.push_back(ParsePostfix(ParsePrimary()));  // `is equalto 3`: one argument, no parentheses
    }
    return Finish(std::move(t));
  }

  const std::vector<Token>& tokens_;
  const int max_depth_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loops_ = 0;
};

}  // namespace

std::variant<Body, Error> Parse(const std::vector<Token>& tokens, int max_depth) {
  try {
    return Parser(tokens, max_depth).Template();
  } catch (const Error& e) {
    return e;
  }
}

}  // namespace ferry::gateway::jinja
