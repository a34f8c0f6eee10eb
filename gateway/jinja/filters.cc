// jinja2's filters and tests, and the globals transformers' environment has (builtins.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <map>
#include <set>

#include <utf8proc.h>

#include "gateway/jinja/builtins.h"
#include "gateway/jinja/strings.h"

namespace ferry::gateway::jinja {

namespace {

using K = Value::Kind;

const Value* Arg(const CallArgs& a, size_t i, const char* keyword) {
  if (i < a.positional.size()) return &a.positional[i];
  for (const auto& [k, v] : a.keyword) {
    if (k == keyword) return &v;
  }
  return nullptr;
}

bool FlagArg(const CallArgs& a, size_t i, const char* keyword) {
  const Value* v = Arg(a, i, keyword);
  return v != nullptr && v->Truthy();
}

// The arguments after the first `skip` positional ones (a test's own arguments in select and kin).
CallArgs Rest(const CallArgs& a, size_t skip) {
  CallArgs rest;
  rest.line = a.line;
  for (size_t i = skip; i < a.positional.size(); ++i) rest.positional.push_back(a.positional[i]);
  return rest;
}

// jinja2's make_attrgetter: "a.b.0" looks up a, then b, then item 0.
Value Lookup(const Value& item, const std::string& path, int line) {
  Value v = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    v = GetItem(v, digits ? Value::Int(std::stoll(part)) : Value::String(part), line);
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

std::optional<std::string> AttributeArg(const CallArgs& a, size_t i) {
  const Value* v = Arg(a, i, "attribute");
  if (v == nullptr || v->is_none()) return std::nullopt;
  return ToStr(*v);
}

// A sort key as jinja2 builds one: the attribute when given, strings lowercased unless case_sensitive.
Value SortKey(const Value& item, const std::optional<std::string>& attribute, bool case_sensitive, int line) {
  Value key = attribute ? Lookup(item, *attribute, line) : item;
  if (!case_sensitive && key.is_string()) key = Value::String(MapCase(key.str(), CaseMap::kLower));
  return key;
}

bool Less(const Value& a, const Value& b, int line) {
  return BinaryOp("<", a, b, line, ValueLimits()).as_bool();
}

Value SelectFilter(const std::string& name, const Value& value, const CallArgs& a) {
  const bool by_attr = name == "selectattr" || name == "rejectattr";
  const bool keep = name == "select" || name == "selectattr";
  std::string attribute;
  size_t next = 0;
  if (by_attr) {
    const Value* attr = Arg(a, 0, "attr");
    if (attr == nullptr) throw Error{"Missing parameter for attribute name", a.line};
    attribute = ToStr(*attr);
    next = 1;
  }
  const Value* test = Arg(a, next, "test");
  List out;
  for (const Value& item : Iterate(value, a.line)) {
    const Value subject = by_attr ? Lookup(item, attribute, a.line) : item;
    const bool passed = test == nullptr ? subject.Truthy() : ApplyTest(ToStr(*test), subject, Rest(a, next + 1));
    if (passed == keep) out.push_back(item);
  }
  return Value::MakeList(std::move(out));
}

Value MapFilter(const Value& value, const CallArgs& a, const ValueLimits& limits) {
  List out;
  if (auto attribute = AttributeArg(a, 99)) {
    const Value* fallback = Arg(a, 99, "default");
    for (const Value& item : Iterate(value, a.line)) {
      Value v = Lookup(item, *attribute, a.line);
      out.push_back(v.is_undefined() && fallback ? *fallback : v);
    }
    return Value::MakeList(std::move(out));
  }
  const Value* filter = Arg(a, 0, "");
  if (filter == nullptr) return Value::MakeList(Iterate(value, a.line));
  const std::string name = ToStr(*filter);
  if (!IsKnownFilter(name)) throw Error{"the filter '" + name + "' is not served by Ferry's template engine", a.line};
  CallArgs rest = Rest(a, 1);
  rest.keyword = a.keyword;
  for (const Value& item : Iterate(value, a.line)) out.push_back(ApplyFilter(name, item, rest, limits));
  return Value::MakeList(std::move(out));
}

Value ToJsonFilter(const Value& value, const CallArgs& a) {
  JsonOptions o;
  o.ensure_ascii = FlagArg(a, 0, "ensure_ascii");
  if (const Value* indent = Arg(a, 1, "indent"); indent != nullptr && !indent->is_none()) {
    if (indent->kind() != K::kInt) throw Error{"tojson's indent must be an integer", a.line};
    o.indent = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(indent->as_int(), 64)));
    if (indent->as_int() < 0) o.indent = 0;  // Python writes newlines without indentation for indent <= 0
  }
  if (const Value* sep = Arg(a, 2, "separators"); sep != nullptr && !sep->is_none()) {
    if (!sep->is_list() || sep->list().size() != 2 || !sep->list()[0].is_string() || !sep->list()[1].is_string()) {
      throw Error{"tojson's separators must be a pair of strings", a.line};
    }
    o.item_separator = sep->list()[0].str();
    o.key_separator = sep->list()[1].str();
  }
  o.sort_keys = FlagArg(a, 3, "sort_keys");
  try {
    return Value::String(ToJson(value, o));
  } catch (Error& e) {
    e.line = a.line;
    throw;
  }
}

Value IntFilter(const Value& value, const CallArgs& a) {
  if (value.is_undefined()) throw Error{value.str(), a.line};  // int(Undefined) raises in jinja2
  const Value* fallback = Arg(a, 0, "default");
  const Value result_default = fallback ? *fallback : Value::Int(0);
  switch (value.kind()) {
    case K::kInt:
    case K::kBool: return Value::Int(value.as_int());
    case K::kFloat: {
      const double d = value.as_double();
      if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return result_default;
      return Value::Int(static_cast<int64_t>(d));
    }
    case K::kString: {
      const std::string s = PyStrip(value.str(), std::nullopt, true, true);
      char* end = nullptr;
      errno = 0;
      const long long v = std::strtoll(s.c_str(), &end, 10);
      if (!s.empty() && *end == 0 && errno == 0) return Value::Int(v);
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && *end == 0 && std::isfinite(d) && std::fabs(d) < 9.2e18) return Value::Int(static_cast<int64_t>(d));
      return result_default;
    }
    default: return result_default;
  }
}

Value FloatFilter(const Value& value, const CallArgs& a) {
  if (value.is_undefined()) throw Error{value.str(), a.line};
  const Value* fallback = Arg(a, 0, "default");
  if (value.is_number()) return Value::Float(value.as_double());
  if (value.is_string()) {
    const std::string s = PyStrip(value.str(), std::nullopt, true, true);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == 0) return Value::Float(d);
  }
  return fallback ? *fallback : Value::Float(0.0);
}

Value Length(const Value& value, int line) {
  switch (value.kind()) {
    case K::kString: return Value::Int(static_cast<int64_t>(CodePointCount(value.str())));
    case K::kList: return Value::Int(static_cast<int64_t>(value.list().size()));
    case K::kDict: return Value::Int(static_cast<int64_t>(value.dict().size()));
    case K::kUndefined: return Value::Int(0);
    default: throw Error{std::string("object of type '") + value.TypeName() + "' has no len()", line};
  }
}

Value Items(const Value& value, int line) {
  if (value.is_undefined()) return Value::MakeList({});
  if (value.kind() != K::kDict) throw Error{"Can only get item pairs from a mapping.", line};
  List out;
  for (const auto& [k, v] : value.dict().items()) out.push_back(Value::MakeTuple({Value::String(k), v}));
  return Value::MakeList(std::move(out));
}

Value Join(const Value& value, const CallArgs& a, const ValueLimits& limits) {
  const Value* sep = Arg(a, 0, "d");
  const std::string separator = sep ? ToStr(*sep) : "";
  const auto attribute = AttributeArg(a, 1);
  std::string out;
  bool first = true;
  for (const Value& item : Iterate(value, a.line)) {
    if (!first) out += separator;
    first = false;
    out += ToStr(attribute ? Lookup(item, *attribute, a.line) : item);
    CheckLimit(out.size(), limits.max_bytes, "a string", a.line);
  }
  return Value::String(std::move(out));
}

Value Sorted(const Value& value, const CallArgs& a, bool reverse_arg_first) {
  const bool reverse = FlagArg(a, reverse_arg_first ? 0 : 99, "reverse");
  const bool case_sensitive = FlagArg(a, reverse_arg_first ? 1 : 0, "case_sensitive");
  const auto attribute = AttributeArg(a, reverse_arg_first ? 2 : 1);
  List items = Iterate(value, a.line);
  std::vector<std::pair<Value, size_t>> keyed;
  for (size_t i = 0; i < items.size(); ++i) keyed.emplace_back(SortKey(items[i], attribute, case_sensitive, a.line), i);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? Less(y.first, x.first, a.line) : Less(x.first, y.first, a.line);
  });
  List out;
  for (const auto& [key, i] : keyed) out.push_back(items[i]);
  return Value::MakeList(std::move(out));
}

Value Indent(const Value& value, const CallArgs& a) {
  const Value* width = Arg(a, 0, "width");
  const std::string indention = width == nullptr ? "    " : width->is_string() ? width->str()
                                                          : std::string(static_cast<size_t>(std::clamp<int64_t>(width->as_int(), 0, 256)), ' ');
  const bool first = FlagArg(a, 1, "first"), blank = FlagArg(a, 2, "blank");
  const std::vector<std::string> lines = PySplitLines(ToStr(value) + "\n", false);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "\n" + (blank || !lines[i].empty() ? indention : "");
    out += lines[i];
  }
  return Value::String(first ? indention + out : out);
}

Value Escape(const Value& value) {
  std::string out;
  for (const char c : ToStr(value)) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return Value::String(std::move(out));
}

Value Round(const Value& value, const CallArgs& a) {
  const Value* precision_v = Arg(a, 0, "precision");
  const int64_t precision = precision_v ? precision_v->as_int() : 0;
  const Value* method_v = Arg(a, 1, "method");
  const std::string method = method_v ? ToStr(*method_v) : "common";
  if (method != "common" && method != "ceil" && method != "floor") {
    throw Error{"method must be common, ceil or floor", a.line};
  }
  if (!value.is_number()) throw Error{std::string("type ") + value.TypeName() + " doesn't define __round__ method", a.line};
  if (method == "common" && value.kind() != K::kFloat) return Value::Int(value.as_int());
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = value.as_double() * scale;
  const double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::nearbyint(x);
  return Value::Float(r / scale);
}

Value Reverse(const Value& value, int line) {
  if (value.is_string()) {
    std::vector<std::string> cps = CodePoints(value.str());
    std::string out;
    for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
    return Value::String(std::move(out));
  }
  List items = Iterate(value, line);
  std::reverse(items.begin(), items.end());
  return Value::MakeList(std::move(items));
}

Value MinMax(const Value& value, const CallArgs& a, bool max) {
  const bool case_sensitive = FlagArg(a, 0, "case_sensitive");
  const auto attribute = AttributeArg(a, 1);
  const List items = Iterate(value, a.line);
  if (items.empty()) return Value::Undefined(std::string("No aggregated item, sequence was empty."));
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    const Value k = SortKey(items[i], attribute, case_sensitive, a.line);
    const Value b = SortKey(items[best], attribute, case_sensitive, a.line);
    if (max ? Less(b, k, a.line) : Less(k, b, a.line)) best = i;
  }
  return items[best];
}

Value Unique(const Value& value, const CallArgs& a) {
  const bool case_sensitive = FlagArg(a, 0, "case_sensitive");
  const auto attribute = AttributeArg(a, 1);
  List out, seen;
  for (const Value& item : Iterate(value, a.line)) {
    const Value key = SortKey(item, attribute, case_sensitive, a.line);
    if (!Hashable(key)) throw Error{std::string("unhashable type: '") + key.TypeName() + "'", a.line};
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return Equal(s, key); })) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value::MakeList(std::move(out));
}

Value Sum(const Value& value, const CallArgs& a, const ValueLimits& limits) {
  const auto attribute = AttributeArg(a, 0);
  const Value* start = Arg(a, 1, "start");
  Value total = start ? *start : Value::Int(0);
  for (const Value& item : Iterate(value, a.line)) {
    total = BinaryOp("+", total, attribute ? Lookup(item, *attribute, a.line) : item, a.line, limits);
  }
  return total;
}

Value DictSort(const Value& value, const CallArgs& a) {
  if (value.kind() != K::kDict) throw Error{"You can only sort by either \"key\" or \"value\" of a mapping", a.line};
  const bool case_sensitive = FlagArg(a, 0, "case_sensitive");
  const Value* by = Arg(a, 1, "by");
  const bool by_value = by != nullptr && ToStr(*by) == "value";
  if (by != nullptr && !by_value && ToStr(*by) != "key") throw Error{"You can only sort by either \"key\" or \"value\"", a.line};
  const bool reverse = FlagArg(a, 2, "reverse");
  List pairs = Items(value, a.line).list();
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
    const Value kx = SortKey(x.list()[by_value ? 1 : 0], std::nullopt, case_sensitive, a.line);
    const Value ky = SortKey(y.list()[by_value ? 1 : 0], std::nullopt, case_sensitive, a.line);
    return reverse ? Less(ky, kx, a.line) : Less(kx, ky, a.line);
  });
  return Value::MakeList(std::move(pairs));
}

int64_t WordCount(const std::string& s) {
  int64_t n = 0;
  bool in_word = false;
  for (const std::string& cp_text : CodePoints(s)) {
    utf8proc_int32_t cp = 0;
    utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(cp_text.data()),
                     static_cast<utf8proc_ssize_t>(cp_text.size()), &cp);
    const auto c = utf8proc_category(cp);
    const bool word = cp == '_' || (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
                      (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
    if (word && !in_word) ++n;
    in_word = word;
  }
  return n;
}

using FilterFn = Value (*)(const Value&, const CallArgs&, const ValueLimits&);

const std::map<std::string, FilterFn>& Filters() {
  static const std::map<std::string, FilterFn> filters = {
      {"abs", [](const Value& v, const CallArgs& a, const ValueLimits&) {
         if (!v.is_number()) throw Error{std::string("bad operand type for abs(): '") + v.TypeName() + "'", a.line};
         return v.kind() == K::kFloat ? Value::Float(std::fabs(v.as_double())) : Value::Int(std::llabs(v.as_int()));
       }},
      {"capitalize", [](const Value& v, const CallArgs&, const ValueLimits&) { return Value::String(PyCapitalize(ToStr(v))); }},
      {"count", [](const Value& v, const CallArgs& a, const ValueLimits&) { return Length(v, a.line); }},
      {"length", [](const Value& v, const CallArgs& a, const ValueLimits&) { return Length(v, a.line); }},
      {"default", [](const Value& v, const CallArgs& a, const ValueLimits&) {
         const Value* fallback = Arg(a, 0, "default_value");
         const bool use = v.is_undefined() || (FlagArg(a, 1, "boolean") && !v.Truthy());
         return use ? (fallback ? *fallback : Value::String("")) : v;
       }},
      {"dictsort", [](const Value& v, const CallArgs& a, const ValueLimits&) { return DictSort(v, a); }},
      {"escape", [](const Value& v, const CallArgs&, const ValueLimits&) { return Escape(v); }},
      {"first", [](const Value& v, const CallArgs& a, const ValueLimits&) {
         const List items = Iterate(v, a.line);
         return items.empty() ? Value::Undefined("No first item, sequence was empty.") : items.front();
       }},
      {"last", [](const Value& v, const CallArgs& a, const ValueLimits&) {
         const List items = Iterate(v, a.line);
         return items.empty() ? Value::Undefined("No last item, sequence was empty.") : items.back();
       }},
      {"float", [](const Value& v, const CallArgs& a, const ValueLimits&) { return FloatFilter(v, a); }},
      {"int", [](const Value& v, const CallArgs& a, const ValueLimits&) { return IntFilter(v, a); }},
      {"indent", [](const Value& v, const CallArgs& a, const ValueLimits&) { return Indent(v, a); }},
      {"items", [](const Value& v, const CallArgs& a, const ValueLimits&) { return Items(v, a.line); }},
      {"join", [](const Value& v, const CallArgs& a, const ValueLimits& l) { return Join(v, a, l); }},
      {"list", [](const Value& v, const CallArgs& a, const ValueLimits&) { return Value::MakeList(Iterate(v, a.line)); }},
      {"lower", [](const Value& v, const CallArgs&, const ValueLimits&) { return Value::String(MapCase(ToStr(v), CaseMap::kLower)); }},
      {"upper", [](const Value& v, const CallArgs&, const ValueLimits&) { return Value::String(MapCase(ToStr(v), CaseMap::kUpper)); }},
      {"map", [](const Value& v, const CallArgs& a, const ValueLimits& l) { return MapFilter(v, a, l); }},
      {"max", [](const Value& v, const CallArgs& a, const ValueLimits&) { return MinMax(v, a, true); }},
      {"min", [](const Value& v, const CallArgs& a, const ValueLimits&) { return MinMax(v, a, false); }},
      {"reject", [](const Value& v, const CallArgs& a, const ValueLimits&) { return SelectFilter("reject", v, a); }},
      {"rejectattr", [](const Value& v, const CallArgs& a, const ValueLimits&) { return SelectFilter("rejectattr", v, a); }},
      {"select", [](const Value& v, const CallArgs& a, const ValueLimits&) { return SelectFilter("select", v, a); }},
      {"selectattr", [](const Value& v, const CallArgs& a, const ValueLimits&) { return SelectFilter("selectattr", v, a); }},
      {"replace", [](const Value& v, const CallArgs& a, const ValueLimits& l) {
         const Value* old_v = Arg(a, 0, "old");
         const Value* new_v = Arg(a, 1, "new");
         if (old_v == nullptr || new_v == nullptr) throw Error{"replace needs old and new", a.line};
         const Value* count = Arg(a, 2, "count");
         return Value::String(PyReplace(ToStr(v), ToStr(*old_v), ToStr(*new_v),
                                        count && !count->is_none() ? count->as_int() : -1, l.max_bytes));
       }},
      {"reverse", [](const Value& v, const CallArgs& a, const ValueLimits&) { return Reverse(v, a.line); }},
      {"round", [](const Value& v, const CallArgs& a, const ValueLimits&) { return Round(v, a); }},
      {"safe", [](const Value& v, const CallArgs&, const ValueLimits&) { return Value::String(ToStr(v)); }},
      {"sort", [](const Value& v, const CallArgs& a, const ValueLimits&) { return Sorted(v, a, true); }},
      {"string", [](const Value& v, const CallArgs&, const ValueLimits&) { return Value::String(ToStr(v)); }},
      {"sum", [](const Value& v, const CallArgs& a, const ValueLimits& l) { return Sum(v, a, l); }},
      {"title", [](const Value& v, const CallArgs&, const ValueLimits&) { return Value::String(JinjaTitle(ToStr(v))); }},
      {"tojson", [](const Value& v, const CallArgs& a, const ValueLimits&) { return ToJsonFilter(v, a); }},
      {"trim", [](const Value& v, const CallArgs& a, const ValueLimits&) {
         const Value* chars = Arg(a, 0, "chars");
         return Value::String(PyStrip(ToStr(v), chars && !chars->is_none() ? std::optional(ToStr(*chars)) : std::nullopt,
                                      true, true));
       }},
      {"unique", [](const Value& v, const CallArgs& a, const ValueLimits&) { return Unique(v, a); }},
      {"wordcount", [](const Value& v, const CallArgs&, const ValueLimits&) { return Value::Int(WordCount(ToStr(v))); }},
  };
  return filters;
}

const std::set<std::string>& TestNames() {
  static const std::set<std::string> names = {
      "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "escaped", "even", "false", "filter",
      "float", "ge", ">=", "gt", ">", "greaterthan", "in", "integer", "iterable", "le", "<=", "lower", "lt", "<",
      "lessthan", "mapping", "ne", "!=", "none", "number", "odd", "sameas", "sequence", "string", "test", "true",
      "undefined", "upper"};
  return names;
}

const Value& TestArg(const CallArgs& a, const std::string& test) {
  if (a.positional.empty()) throw Error{"the test '" + test + "' needs an argument", a.line};
  return a.positional[0];
}

}  // namespace

bool IsKnownFilter(const std::string& name) {
  return Filters().count(name) > 0 || name == "d" || name == "e";
}

bool IsKnownTest(const std::string& name) { return TestNames().count(name) > 0; }

Value ApplyFilter(const std::string& name, const Value& value, const CallArgs& args, const ValueLimits& limits) {
  const std::string canonical = name == "d" ? "default" : name == "e" ? "escape" : name;
  const auto it = Filters().find(canonical);
  if (it == Filters().end()) throw Error{"the filter '" + name + "' is not served by Ferry's template engine", args.line};
  return it->second(value, args, limits);
}

bool ApplyTest(const std::string& name, const Value& v, const CallArgs& a) {
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind() == K::kBool;
  if (name == "true") return v.kind() == K::kBool && v.as_bool();
  if (name == "false") return v.kind() == K::kBool && !v.as_bool();
  if (name == "integer") return v.kind() == K::kInt;
  if (name == "float") return v.kind() == K::kFloat;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.kind() == K::kDict;
  if (name == "iterable") return v.is_string() || v.is_list() || v.kind() == K::kDict || v.is_undefined();
  if (name == "sequence") return v.is_string() || v.is_list() || v.kind() == K::kDict || v.is_undefined();
  if (name == "callable") return v.kind() == K::kCallable;
  if (name == "escaped") return false;  // no Markup objects: autoescape is off
  if (name == "lower" || name == "upper") return v.is_string() && PyIsClass(v.str(), "is" + name);
  if (name == "odd" || name == "even") {  // value % 2 == 1 (or 0), with Python's % on any number
    return Equal(BinaryOp("%", v, Value::Int(2), a.line, ValueLimits()), Value::Int(name == "odd" ? 1 : 0));
  }
  if (name == "divisibleby") {
    const Value& n = TestArg(a, name);
    if (n.as_int() == 0) throw Error{"integer division or modulo by zero", a.line};
    return v.as_int() % n.as_int() == 0;
  }
  if (name == "in") return BinaryOp("in", v, TestArg(a, name), a.line, ValueLimits()).as_bool();
  if (name == "sameas") {
    const Value& other = TestArg(a, name);
    if (v.is_number() || v.is_none() || other.is_none()) return v.kind() == other.kind() && Equal(v, other);
    return v.kind() == other.kind() && (v.is_string() ? &v.str() == &other.str() : Equal(v, other));
  }
  if (name == "filter") return IsKnownFilter(ToStr(v));
  if (name == "test") return IsKnownTest(ToStr(v));
  static const std::map<std::string, std::string> kCompare = {
      {"eq", "=="}, {"equalto", "=="}, {"==", "=="}, {"ne", "!="}, {"!=", "!="}, {"lt", "<"}, {"<", "<"},
      {"lessthan", "<"}, {"le", "<="}, {"<=", "<="}, {"gt", ">"}, {">", ">"}, {"greaterthan", ">"}, {"ge", ">="},
      {">=", ">="}};
  if (const auto it = kCompare.find(name); it != kCompare.end()) {
    return BinaryOp(it->second, v, TestArg(a, name), a.line, ValueLimits()).as_bool();
  }
  throw Error{"the test '" + name + "' is not served by Ferry's template engine", a.line};
}

Dict Globals(const ValueLimits& limits) {
  Dict g;
  g.Set("range", Value::Callable("range", [limits](CallArgs& a) {
          for (const Value& v : a.positional) {
            if (v.kind() != K::kInt && v.kind() != K::kBool) {
              throw Error{std::string("'") + v.TypeName() + "' object cannot be interpreted as an integer", a.line};
            }
          }
          if (a.positional.empty() || a.positional.size() > 3) throw Error{"range expected 1 to 3 arguments", a.line};
          const bool one = a.positional.size() == 1;
          const int64_t start = one ? 0 : a.positional[0].as_int();
          const int64_t stop = one ? a.positional[0].as_int() : a.positional[1].as_int();
          const int64_t step = a.positional.size() == 3 ? a.positional[2].as_int() : 1;
          if (step == 0) throw Error{"range() arg 3 must not be zero", a.line};
          // Python's len(range): a stop not ahead of start in the step's direction gives no items.
          // Unsigned spans, so that a range across all of int64 neither overflows nor rounds.
          const bool forward = step > 0;
          uint64_t count = 0;
          if (forward ? start < stop : start > stop) {
            const uint64_t span = forward ? static_cast<uint64_t>(stop) - static_cast<uint64_t>(start)
                                          : static_cast<uint64_t>(start) - static_cast<uint64_t>(stop);
            const uint64_t stride = forward ? static_cast<uint64_t>(step) : uint64_t{0} - static_cast<uint64_t>(step);
            count = (span - 1) / stride + 1;
          }
          CheckLimit(count, limits.max_items, "a list", a.line);
          List out;
          out.reserve(count);
          for (uint64_t k = 0; k < count; ++k) {  // start + k * step stays between start and stop
            out.push_back(Value::Int(static_cast<int64_t>(static_cast<uint64_t>(start) + k * static_cast<uint64_t>(step))));
          }
          return Value::MakeList(std::move(out));
        }));
  auto make_dict = [](CallArgs& a, bool ns) {
    Dict d;
    if (!a.positional.empty()) {
      if (a.positional.size() > 1 || a.positional[0].kind() != K::kDict) {
        throw Error{std::string(ns ? "namespace" : "dict") + "() takes a mapping and keyword arguments", a.line};
      }
      d = a.positional[0].dict();
    }
    for (auto& [k, v] : a.keyword) d.Set(k, v);
    if (ns && Value::MakeDict(d).holds_namespace()) {
      throw Error{"a namespace holding a namespace is not served by Ferry's template engine", a.line};
    }
    return ns ? Value::Namespace(std::move(d)) : Value::MakeDict(std::move(d));
  };
  g.Set("namespace", Value::Callable("namespace", [make_dict](CallArgs& a) { return make_dict(a, true); }));
  g.Set("dict", Value::Callable("dict", [make_dict](CallArgs& a) { return make_dict(a, false); }));
  g.Set("raise_exception", Value::Callable("raise_exception", [](CallArgs& a) -> Value {
          throw Error{a.positional.empty() ? std::string() : ToStr(a.positional[0]), a.line};
        }));
  g.Set("strftime_now", Value::Callable("strftime_now", [](CallArgs& a) {
          if (a.positional.empty() || !a.positional[0].is_string()) throw Error{"strftime_now needs a format string", a.line};
          const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
          std::tm local{};
          localtime_r(&now, &local);
          char buf[512];
          const size_t n = std::strftime(buf, sizeof buf, a.positional[0].str().c_str(), &local);
          return Value::String(std::string(buf, n));
        }));
  return g;
}

}  // namespace ferry::gateway::jinja
