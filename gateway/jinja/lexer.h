// Splits a template into text and tag tokens as jinja2's lexer does with transformers' settings
// (trim_blocks, lstrip_blocks, keep_trailing_newline off): newlines normalised to "\n", one
// trailing newline dropped, "{%-"/"-%}" strip whitespace, "+" keeps it, a block tag alone on its
// line takes the line's indentation and its newline with it. Comments are dropped here.
#pragma once

#include <string>
#include <variant>
#include <vector>

#include "gateway/jinja/value.h"

namespace ferry::gateway::jinja {

struct Token {
  enum class Kind {
    kText,        // template data
    kVarBegin,    // {{
    kVarEnd,      // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,
    kString,      // text: the value, escapes resolved
    kInt,
    kFloat,
    kOp,          // text: the operator
    kEof,
  };
  Kind kind;
  std::string text;
  int line = 1;
};

std::variant<std::vector<Token>, Error> Tokenize(const std::string& source);

// Python's str.isspace for one code point.
bool IsPySpace(uint32_t cp);

}  // namespace ferry::gateway::jinja
