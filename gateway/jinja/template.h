// A Jinja template, rendered as transformers' apply_chat_template renders chat templates (jinja2
// 3.1 in an ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, loop controls, the
// {% generation %} tag, and the globals raise_exception and strftime_now). README.md beside this
// file lists what is served; anything else is refused by Parse, naming it and its line.
#pragma once

#include <memory>
#include <string>
#include <variant>

#include "gateway/jinja/ast.h"
#include "gateway/jinja/builtins.h"
#include "gateway/jinja/value.h"

namespace ferry::gateway::jinja {

// Bounds that keep a hostile template from exhausting the process.
struct Limits {
  size_t max_template_bytes = 1u << 20;
  int max_nesting = 128;           // statements and expressions inside one another
  size_t max_output_bytes = 16u << 20;
  int64_t max_steps = 10'000'000;  // statements, expressions and loop iterations, per render
  int max_call_depth = 32;         // macros calling macros
  ValueLimits values;
};

class Template {
 public:
  static std::variant<Template, Error> Parse(const std::string& source, Limits limits = {});

  // variables: the template's variables (messages, tools, ...); the globals are under them.
  // An Error is the template's own raise_exception or what jinja2 would raise; never a crash.
  std::variant<std::string, Error> Render(const Dict& variables) const;

 private:
  std::shared_ptr<const Body> body_;
  Limits limits_;
};

}  // namespace ferry::gateway::jinja
