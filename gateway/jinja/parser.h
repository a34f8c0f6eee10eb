// Builds the statement tree from the tokens, with jinja2's grammar and operator precedence
// (parser.py). What it does not serve (an unknown statement, filter or test, `*args`, a recursive
// loop, ...) is an Error naming the construct and its line, so a template is refused when it is
// loaded, never half-rendered.
#pragma once

#include <variant>
#include <vector>

#include "gateway/jinja/ast.h"
#include "gateway/jinja/lexer.h"

namespace ferry::gateway::jinja {

// max_depth: the deepest nesting of statements and expressions (the parser recurses on it).
std::variant<Body, Error> Parse(const std::vector<Token>& tokens, int max_depth);

}  // namespace ferry::gateway::jinja
