// The parsed template: expressions and statements (parser.cc builds them, interpreter.cc runs
// them). Plain trees owned by unique_ptr; `line` is the template line, for errors.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gateway/jinja/value.h"

namespace ferry::gateway::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,   // value
    kName,      // name
    kAttr,      // args[0].name
    kItem,      // args[0][args[1]]
    kSlice,     // args[0][args[1]:args[2]:args[3]] (null: omitted)
    kCall,      // args[0](args[1..], kwargs)
    kFilter,    // args[0] | name(args[1..], kwargs)
    kTest,      // args[0] is [not] name(args[1..]); negated
    kNot,       // not args[0]
    kNeg,       // -args[0]
    kPos,       // +args[0]
    kBinary,    // args[0] op args[1]: + - * / // % ** ~ == != < > <= >= in notin
    kAnd,       // args[0] and args[1]
    kOr,        // args[0] or args[1]
    kCond,      // args[0] if args[1] else args[2] (args[2] null: Undefined)
    kList,      // [args...]
    kTuple,     // (args...)
    kDict,      // {kwargs...}: keys are expressions in args (even) and values (odd)
  };
  Kind kind;
  int line = 0;
  int depth = 1;     // the tree's depth below and including this node (bounded by the parser)
  Value value;       // kLiteral
  std::string name;  // kName, kAttr, kFilter, kTest; kBinary: the operator
  bool negated = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class Kind {
    kText,      // text
    kPrint,     // {{ expr }}
    kIf,        // conditions[i] -> bodies[i]; a trailing else is bodies.back() when bodies > conditions
    kFor,       // for targets in expr [if filter] bodies[0] [else bodies[1]]
    kSet,       // set targets = expr (targets > 1: unpacking); ns_attr: set targets[0].ns_attr = expr
    kSetBlock,  // set targets[0] %} bodies[0] {% endset
    kMacro,     // macro name(targets with defaults) bodies[0]
    kBreak,
    kContinue,
    kBlock,     // bodies[0] as is ({% generation %}, transformers' assistant-mask tag)
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  std::vector<std::string> targets;
  std::vector<ExprPtr> defaults;  // kMacro: one per target (null: required)
  std::string name;               // kMacro
  std::string ns_attr;            // kSet on a namespace's attribute
};

}  // namespace ferry::gateway::jinja
