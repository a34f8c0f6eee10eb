// What a template can do with values: Python's operators, attribute and item lookup (with the
// str, dict and list methods templates call), and jinja2's filters, tests and the globals
// transformers adds. Each throws Error, with jinja2's message where there is one, on what Python
// would raise on. Nothing here mutates a value: transformers renders in jinja2's
// ImmutableSandboxedEnvironment, so list.append and dict.update are refused there too.
#pragma once

#include <string>

#include "gateway/jinja/value.h"

namespace ferry::gateway::jinja {

// Bounds on what one value may grow to (a string's bytes, a list's items): a template that builds
// past them fails instead of exhausting memory.
struct ValueLimits {
  size_t max_bytes = 16u << 20;
  size_t max_items = 1u << 20;
};

bool IsKnownFilter(const std::string& name);
bool IsKnownTest(const std::string& name);

// value | name(args...).
Value ApplyFilter(const std::string& name, const Value& value, const CallArgs& args, const ValueLimits& limits);
// value is name(args...).
bool ApplyTest(const std::string& name, const Value& value, const CallArgs& args);

// obj.name: jinja2's getattr (an attribute such as a str method first, then the item); Undefined
// when neither is there. Fails on an Undefined obj.
Value GetAttr(const Value& obj, const std::string& name, int line);
// obj[key]: the item first, then the attribute (jinja2's getitem).
Value GetItem(const Value& obj, const Value& key, int line);
// obj[start:stop:step], each None when omitted.
Value GetSlice(const Value& obj, const Value& start, const Value& stop, const Value& step, int line,
               const ValueLimits& limits);

// a op b for + - * / // % ** ~ == != < > <= >= in notin.
Value BinaryOp(const std::string& op, const Value& a, const Value& b, int line, const ValueLimits& limits);
// -v, +v.
Value Negate(const Value& v, bool minus, int line);

// Iteration as Python's for: a list's items, a dict's keys, a string's characters, nothing for
// Undefined; anything else fails.
List Iterate(const Value& v, int line);

// The globals transformers' environment adds: range, namespace, dict, raise_exception, strftime_now.
// raise_exception throws Error with the template's message.
Dict Globals(const ValueLimits& limits);

// Throws when n passes max: "<what> passed the template engine's limit of <max> <unit>".
void CheckLimit(size_t n, size_t max, const char* what, int line);

}  // namespace ferry::gateway::jinja
