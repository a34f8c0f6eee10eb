// Python's operators, lookups and the str/dict/list methods, on Values (builtins.h).
#include <algorithm>
#include <cmath>

#include "gateway/jinja/builtins.h"
#include "gateway/jinja/lexer.h"
#include "gateway/jinja/strings.h"

namespace ferry::gateway::jinja {

namespace {

using K = Value::Kind;

[[noreturn]] void TypeError(const std::string& message, int line) { throw Error{message, line}; }

// The message of an Undefined used where a value is needed (jinja2's UndefinedError).
[[noreturn]] void UndefinedError(const Value& v, int line) { throw Error{v.str(), line}; }

// jinja2's object_type_repr: "'dict object'", "None".
std::string ObjectRepr(const Value& v) {
  if (v.is_none()) return "None";
  return std::string("'") + v.TypeName() + " object'";
}

Value Missing(const Value& obj, const std::string& name) {
  return Value::Undefined(ObjectRepr(obj) + " has no attribute '" + name + "'");
}

const Value* Arg(const CallArgs& a, size_t i, const char* keyword) {
  if (i < a.positional.size()) return &a.positional[i];
  for (const auto& [k, v] : a.keyword) {
    if (k == keyword) return &v;
  }
  return nullptr;
}

const std::string& StrArg(const CallArgs& a, size_t i, const char* keyword, const char* method) {
  const Value* v = Arg(a, i, keyword);
  if (v == nullptr || !v->is_string()) {
    throw Error{std::string(method) + "() argument must be str, not " + (v ? v->TypeName() : "missing"), a.line};
  }
  return v->str();
}

// The optional `chars` argument of strip and its kin: None when absent or None.
std::optional<std::string> CharsArg(const CallArgs& a) {
  const Value* v = Arg(a, 0, "chars");
  if (v == nullptr || v->is_none()) return std::nullopt;
  if (!v->is_string()) throw Error{std::string("strip arg must be None or str, not ") + v->TypeName(), a.line};
  return v->str();
}

int64_t IntArg(const CallArgs& a, size_t i, const char* keyword, int64_t fallback) {
  const Value* v = Arg(a, i, keyword);
  if (v == nullptr || v->is_none()) return fallback;
  if (v->kind() != K::kInt && v->kind() != K::kBool) {
    throw Error{std::string("'") + v->TypeName() + "' object cannot be interpreted as an integer", a.line};
  }
  return v->as_int();
}

List StringList(const std::vector<std::string>& parts) {
  List out;
  out.reserve(parts.size());
  for (const auto& p : parts) out.push_back(Value::String(p));
  return out;
}

// Prefixes for startswith/endswith: a str or a tuple (list) of them.
std::vector<std::string> Affixes(const CallArgs& a, const char* method) {
  const Value* v = Arg(a, 0, "prefix");
  if (v != nullptr && v->is_list()) {
    std::vector<std::string> out;
    for (const Value& e : v->list()) {
      if (!e.is_string()) TypeError(std::string("tuple for ") + method + " must only contain str", a.line);
      out.push_back(e.str());
    }
    return out;
  }
  if (v == nullptr || !v->is_string()) {
    TypeError(std::string(method) + " first arg must be str or a tuple of str", a.line);
  }
  return {v->str()};
}

std::optional<Value> StrMethod(const std::string& s, const std::string& name, const ValueLimits& limits) {
  auto method = [&](Function fn) { return Value::Callable("str." + name, std::move(fn)); };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip", right = name != "lstrip";
    return method([s, left, right](CallArgs& a) { return Value::String(PyStrip(s, CharsArg(a), left, right)); });
  }
  if (name == "startswith" || name == "endswith") {
    const bool start = name == "startswith";
    return method([s, start](CallArgs& a) {
      for (const std::string& affix : Affixes(a, start ? "startswith" : "endswith")) {
        if (affix.size() <= s.size() && s.compare(start ? 0 : s.size() - affix.size(), affix.size(), affix) == 0) {
          return Value::Bool(true);
        }
      }
      return Value::Bool(false);
    });
  }
  if (name == "split" || name == "rsplit") {
    const bool from_right = name == "rsplit";
    return method([s, from_right](CallArgs& a) {
      const Value* sep = Arg(a, 0, "sep");
      std::optional<std::string> separator;
      if (sep != nullptr && !sep->is_none()) separator = StrArg(a, 0, "sep", "split");
      if (separator && separator->empty()) throw Error{"empty separator", a.line};
      return Value::MakeList(StringList(PySplit(s, separator, IntArg(a, 1, "maxsplit", -1), from_right)));
    });
  }
  if (name == "splitlines") {
    return method([s](CallArgs& a) {
      const Value* keep = Arg(a, 0, "keepends");
      return Value::MakeList(StringList(PySplitLines(s, keep != nullptr && keep->Truthy())));
    });
  }
  if (name == "upper" || name == "lower" || name == "capitalize" || name == "title") {
    return method([s, name](CallArgs&) {
      if (name == "upper") return Value::String(MapCase(s, CaseMap::kUpper));
      if (name == "lower") return Value::String(MapCase(s, CaseMap::kLower));
      if (name == "capitalize") return Value::String(PyCapitalize(s));
      return Value::String(PyTitle(s));
    });
  }
  if (name == "replace") {
    return method([s, limits](CallArgs& a) {
      const std::string out = PyReplace(s, StrArg(a, 0, "old", "replace"), StrArg(a, 1, "new", "replace"),
                                        IntArg(a, 2, "count", -1), limits.max_bytes);
      return Value::String(out);
    });
  }
  if (name == "find" || name == "rfind" || name == "count") {
    return method([s, name](CallArgs& a) {
      const std::string& sub = StrArg(a, 0, "sub", name.c_str());
      if (name == "count") return Value::Int(PyCount(s, sub));
      const size_t at = name == "find" ? s.find(sub) : s.rfind(sub);
      return Value::Int(at == std::string::npos ? -1 : static_cast<int64_t>(CodePointCount(s.substr(0, at))));
    });
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const bool prefix = name == "removeprefix";
    return method([s, prefix](CallArgs& a) {
      const std::string& affix = StrArg(a, 0, prefix ? "prefix" : "suffix", prefix ? "removeprefix" : "removesuffix");
      if (affix.size() > s.size()) return Value::String(s);
      if (prefix && s.compare(0, affix.size(), affix) == 0) return Value::String(s.substr(affix.size()));
      if (!prefix && s.compare(s.size() - affix.size(), affix.size(), affix) == 0) {
        return Value::String(s.substr(0, s.size() - affix.size()));
      }
      return Value::String(s);
    });
  }
  if (name == "join") {
    return method([s, limits](CallArgs& a) {
      const Value* items = Arg(a, 0, "iterable");
      if (items == nullptr) throw Error{"join() takes exactly one argument", a.line};
      std::string out;
      bool first = true;
      for (const Value& e : Iterate(*items, a.line)) {
        if (!e.is_string()) TypeError(std::string("sequence item: expected str instance, ") + e.TypeName() + " found", a.line);
        if (!first) out += s;
        first = false;
        out += e.str();
        CheckLimit(out.size(), limits.max_bytes, "a string", a.line);
      }
      return Value::String(std::move(out));
    });
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "islower" ||
      name == "isupper") {
    return method([s, name](CallArgs&) { return Value::Bool(PyIsClass(s, name)); });
  }
  return std::nullopt;
}

// A mutating method: jinja2's sandbox refuses to call it.
Value Unsafe(const Value& obj, const std::string& name) {
  const std::string type = obj.TypeName();
  return Value::Callable(type + "." + name, [type, name](CallArgs& a) -> Value {
    throw Error{"access to attribute '" + name + "' of '" + type + "' object is unsafe.", a.line};
  });
}

std::optional<Value> DictMethod(const Value& d, const std::string& name) {
  if (name == "items" || name == "keys" || name == "values") {
    return Value::Callable("dict." + name, [d, name](CallArgs&) {
      List out;
      for (const auto& [k, v] : d.dict().items()) {
        if (name == "items") out.push_back(Value::MakeTuple({Value::String(k), v}));
        if (name == "keys") out.push_back(Value::String(k));
        if (name == "values") out.push_back(v);
      }
      return Value::MakeList(std::move(out));
    });
  }
  if (name == "get") {
    return Value::Callable("dict.get", [d](CallArgs& a) {
      const Value* key = Arg(a, 0, "key");
      if (key == nullptr) throw Error{"get expected at least 1 argument, got 0", a.line};
      const Value* fallback = Arg(a, 1, "default");
      const Value* found = key->is_string() ? d.dict().Find(key->str()) : nullptr;
      return found ? *found : fallback ? *fallback : Value::None();
    });
  }
  if (name == "copy") return Value::Callable("dict.copy", [d](CallArgs&) { return Value::MakeDict(d.dict()); });
  if (name == "pop" || name == "popitem" || name == "setdefault" || name == "update" || name == "clear") {
    return Unsafe(d, name);
  }
  return std::nullopt;
}

std::optional<Value> ListMethod(const Value& l, const std::string& name) {
  if (name == "index" || name == "count") {
    return Value::Callable("list." + name, [l, name](CallArgs& a) {
      const Value* x = Arg(a, 0, "value");
      if (x == nullptr) throw Error{name + "() takes exactly one argument", a.line};
      int64_t count = 0;
      for (size_t i = 0; i < l.list().size(); ++i) {
        if (!Equal(l.list()[i], *x)) continue;
        if (name == "index") return Value::Int(static_cast<int64_t>(i));
        ++count;
      }
      if (name == "index") throw Error{Repr(*x) + " is not in list", a.line};
      return Value::Int(count);
    });
  }
  static const char* kMutating[] = {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear"};
  for (const char* m : kMutating) {
    if (name == m) return Unsafe(l, name);
  }
  return std::nullopt;
}

// Python's index normalisation: a negative index counts from the end; nullopt when out of range.
std::optional<size_t> Index(int64_t i, size_t size) {
  if (i < 0) i += static_cast<int64_t>(size);
  if (i < 0 || static_cast<size_t>(i) >= size) return std::nullopt;
  return static_cast<size_t>(i);
}

std::optional<int64_t> SliceBound(const Value& v, int line) {
  if (v.is_none() || v.is_undefined()) return std::nullopt;
  if (v.kind() != K::kInt && v.kind() != K::kBool) {
    TypeError("slice indices must be integers or None", line);
  }
  return v.as_int();
}

// Python's PySlice_AdjustIndices: the indices a slice selects.
std::vector<size_t> SliceIndices(size_t size, const Value& start_v, const Value& stop_v, const Value& step_v, int line) {
  const int64_t n = static_cast<int64_t>(size);
  const int64_t step = SliceBound(step_v, line).value_or(1);
  if (step == 0) throw Error{"slice step cannot be zero", line};
  auto adjust = [&](std::optional<int64_t> v, int64_t fallback) {
    if (!v) return fallback;
    int64_t x = *v;
    if (x < 0) x = std::max<int64_t>(x + n, step < 0 ? -1 : 0);
    else x = std::min<int64_t>(x, step < 0 ? n - 1 : n);
    return x;
  };
  const int64_t start = adjust(SliceBound(start_v, line), step < 0 ? n - 1 : 0);
  const int64_t stop = adjust(SliceBound(stop_v, line), step < 0 ? -1 : n);
  std::vector<size_t> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(static_cast<size_t>(i));
  return out;
}

int Compare3(const Value& a, const Value& b, const std::string& op, int line);

int CompareLists(const List& a, const List& b, const std::string& op, int line) {
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!Equal(a[i], b[i])) return Compare3(a[i], b[i], op, line);
  }
  return a.size() < b.size() ? -1 : a.size() > b.size() ? 1 : 0;
}

// <0, 0, >0 as Python orders a and b; fails where Python raises TypeError.
int Compare3(const Value& a, const Value& b, const std::string& op, int line) {
  if (a.is_undefined()) UndefinedError(a, line);
  if (b.is_undefined()) UndefinedError(b, line);
  if (a.is_number() && b.is_number()) {
    if (a.kind() == K::kFloat || b.kind() == K::kFloat) {
      return a.as_double() < b.as_double() ? -1 : a.as_double() > b.as_double() ? 1 : 0;
    }
    return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.str().compare(b.str());  // UTF-8 order is code point order
  if (a.is_list() && b.is_list()) return CompareLists(a.list(), b.list(), op, line);
  TypeError("'" + op + "' not supported between instances of '" + a.TypeName() + "' and '" + b.TypeName() + "'", line);
}

bool Contains(const Value& container, const Value& item, int line) {
  switch (container.kind()) {
    case K::kString:
      if (!item.is_string()) {
        TypeError(std::string("'in <string>' requires string as left operand, not ") + item.TypeName(), line);
      }
      return container.str().find(item.str()) != std::string::npos;
    case K::kList:
      return std::any_of(container.list().begin(), container.list().end(), [&](const Value& e) { return Equal(e, item); });
    case K::kDict:
      if (!Hashable(item)) TypeError(std::string("unhashable type: '") + item.TypeName() + "'", line);
      return item.is_string() && container.dict().Find(item.str()) != nullptr;
    case K::kUndefined: return false;  // iterates as nothing
    default: TypeError(std::string("argument of type '") + container.TypeName() + "' is not iterable", line);
  }
}

[[noreturn]] void Overflow(int line) {
  throw Error{"integer overflow: Python's integers are unbounded, Ferry's template engine stops at 64 bits", line};
}

Value Arithmetic(const std::string& op, const Value& a, const Value& b, int line) {
  if (!a.is_number() || !b.is_number()) {
    TypeError("unsupported operand type(s) for " + op + ": '" + a.TypeName() + "' and '" + b.TypeName() + "'", line);
  }
  const bool floats = a.kind() == K::kFloat || b.kind() == K::kFloat;
  if (op == "/") {
    if (b.as_double() == 0) throw Error{"division by zero", line};
    return Value::Float(a.as_double() / b.as_double());
  }
  if (floats) {
    const double x = a.as_double(), y = b.as_double();
    if ((op == "//" || op == "%") && y == 0) throw Error{"float division by zero", line};
    if (op == "+") return Value::Float(x + y);
    if (op == "-") return Value::Float(x - y);
    if (op == "*") return Value::Float(x * y);
    if (op == "//") return Value::Float(std::floor(x / y));
    if (op == "%") return Value::Float(x - std::floor(x / y) * y);
    return Value::Float(std::pow(x, y));
  }
  const int64_t x = a.as_int(), y = b.as_int();
  int64_t r = 0;
  if (op == "+") {
    if (__builtin_add_overflow(x, y, &r)) Overflow(line);
  } else if (op == "-") {
    if (__builtin_sub_overflow(x, y, &r)) Overflow(line);
  } else if (op == "*") {
    if (__builtin_mul_overflow(x, y, &r)) Overflow(line);
  } else if (op == "//" || op == "%") {
    if (y == 0) throw Error{"integer division or modulo by zero", line};
    if (x == INT64_MIN && y == -1) Overflow(line);
    int64_t q = x / y, m = x % y;
    if (m != 0 && ((m < 0) != (y < 0))) {
      --q;
      m += y;
    }
    r = op == "//" ? q : m;
  } else {  // **
    if (y < 0) return Value::Float(std::pow(static_cast<double>(x), static_cast<double>(y)));
    r = 1;
    int64_t base = x;
    for (int64_t e = y; e > 0; e >>= 1) {  // square-and-multiply; an overflow is a result past 64 bits
      if ((e & 1) && __builtin_mul_overflow(r, base, &r)) Overflow(line);
      if (e > 1 && __builtin_mul_overflow(base, base, &base)) Overflow(line);
    }
  }
  return Value::Int(r);
}

Value Repeat(const Value& seq, int64_t times, int line, const ValueLimits& limits) {
  if (times <= 0) return seq.is_string() ? Value::String("") : Value::MakeList({});
  if (seq.is_string()) {
    CheckLimit(seq.str().size() * static_cast<size_t>(std::min<int64_t>(times, INT32_MAX)), limits.max_bytes, "a string", line);
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += seq.str();
    return Value::String(std::move(out));
  }
  CheckLimit(seq.list().size() * static_cast<size_t>(std::min<int64_t>(times, INT32_MAX)), limits.max_items, "a list", line);
  List out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
  return Value::MakeList(std::move(out));
}

}  // namespace

void CheckLimit(size_t n, size_t max, const char* what, int line) {
  if (n > max) {
    throw Error{std::string(what) + " passed the template engine's limit of " + std::to_string(max) +
                    (std::string(what) == "a list" ? " items" : " bytes"),
                line};
  }
}

List Iterate(const Value& v, int line) {
  switch (v.kind()) {
    case K::kList: return v.list();
    case K::kDict: {
      List keys;
      for (const auto& [k, e] : v.dict().items()) keys.push_back(Value::String(k));
      return keys;
    }
    case K::kString: return StringList(CodePoints(v.str()));
    case K::kUndefined: return {};
    default: TypeError(std::string("'") + v.TypeName() + "' object is not iterable", line);
  }
}

Value GetAttr(const Value& obj, const std::string& name, int line) {
  static const ValueLimits kLimits;
  switch (obj.kind()) {
    case K::kUndefined: UndefinedError(obj, line);
    case K::kString:
      if (auto m = StrMethod(obj.str(), name, kLimits)) return *m;
      return Missing(obj, name);
    case K::kDict: {
      if (auto m = DictMethod(obj, name)) return *m;
      if (const Value* v = obj.dict().Find(name)) return *v;
      return Missing(obj, name);
    }
    case K::kNamespace: {
      if (const Value* v = obj.dict().Find(name)) return *v;
      return Missing(obj, name);
    }
    case K::kList:
      if (auto m = ListMethod(obj, name)) return *m;
      return Missing(obj, name);
    default: return Missing(obj, name);
  }
}

Value GetItem(const Value& obj, const Value& key, int line) {
  switch (obj.kind()) {
    case K::kUndefined: UndefinedError(obj, line);
    case K::kList:
      if (key.kind() == K::kInt || key.kind() == K::kBool) {
        if (auto i = Index(key.as_int(), obj.list().size())) return obj.list()[*i];
        return Value::Undefined(ObjectRepr(obj) + " has no element " + ToStr(key));
      }
      break;
    case K::kString:
      if (key.kind() == K::kInt || key.kind() == K::kBool) {
        const std::vector<std::string> chars = CodePoints(obj.str());
        if (auto i = Index(key.as_int(), chars.size())) return Value::String(chars[*i]);
        return Value::Undefined(ObjectRepr(obj) + " has no element " + ToStr(key));
      }
      break;
    case K::kDict:
      if (key.is_string()) {
        if (const Value* v = obj.dict().Find(key.str())) return *v;
      }
      break;
    default: break;
  }
  if (key.is_string()) return GetAttr(obj, key.str(), line);
  return Value::Undefined(ObjectRepr(obj) + " has no element " + ToStr(key));
}

Value GetSlice(const Value& obj, const Value& start, const Value& stop, const Value& step, int line,
               const ValueLimits& limits) {
  (void)limits;
  if (obj.is_undefined()) UndefinedError(obj, line);
  if (obj.is_list()) {
    List out;
    for (size_t i : SliceIndices(obj.list().size(), start, stop, step, line)) out.push_back(obj.list()[i]);
    return Value::MakeList(std::move(out));
  }
  if (obj.is_string()) {
    const bool ascii = CodePointCount(obj.str()) == obj.str().size();
    const std::vector<std::string> chars = ascii ? std::vector<std::string>() : CodePoints(obj.str());
    const size_t n = ascii ? obj.str().size() : chars.size();
    std::string out;
    for (size_t i : SliceIndices(n, start, stop, step, line)) {
      if (ascii) out += obj.str()[i];
      else out += chars[i];
    }
    return Value::String(std::move(out));
  }
  return Value::Undefined(ObjectRepr(obj) + " has no element slice");
}

Value BinaryOp(const std::string& op, const Value& a, const Value& b, int line, const ValueLimits& limits) {
  if (op == "~") {
    std::string out = ToStr(a) + ToStr(b);
    CheckLimit(out.size(), limits.max_bytes, "a string", line);
    return Value::String(std::move(out));
  }
  if (op == "==") return Value::Bool(Equal(a, b));
  if (op == "!=") return Value::Bool(!Equal(a, b));
  if (op == "in") return Value::Bool(Contains(b, a, line));
  if (op == "notin") return Value::Bool(!Contains(b, a, line));
  if (op == "<") return Value::Bool(Compare3(a, b, op, line) < 0);
  if (op == ">") return Value::Bool(Compare3(a, b, op, line) > 0);
  if (op == "<=") return Value::Bool(Compare3(a, b, op, line) <= 0);
  if (op == ">=") return Value::Bool(Compare3(a, b, op, line) >= 0);
  if (op == "%" && a.is_string()) {
    throw Error{"printf-style string formatting (str % value) is not served by Ferry's template engine", line};
  }
  if (a.is_undefined()) UndefinedError(a, line);
  if (b.is_undefined()) UndefinedError(b, line);
  if (op == "+" && a.is_string() && b.is_string()) {
    CheckLimit(a.str().size() + b.str().size(), limits.max_bytes, "a string", line);
    return Value::String(a.str() + b.str());
  }
  if (op == "+" && a.is_list() && b.is_list()) {
    CheckLimit(a.list().size() + b.list().size(), limits.max_items, "a list", line);
    List out = a.list();
    out.insert(out.end(), b.list().begin(), b.list().end());
    return Value::MakeList(std::move(out));
  }
  if (op == "+" && a.is_string()) {
    TypeError(std::string("can only concatenate str (not \"") + b.TypeName() + "\") to str", line);
  }
  if (op == "*" && (a.is_string() || a.is_list()) && (b.kind() == K::kInt || b.kind() == K::kBool)) {
    return Repeat(a, b.as_int(), line, limits);
  }
  if (op == "*" && (b.is_string() || b.is_list()) && (a.kind() == K::kInt || a.kind() == K::kBool)) {
    return Repeat(b, a.as_int(), line, limits);
  }
  return Arithmetic(op, a, b, line);
}

Value Negate(const Value& v, bool minus, int line) {
  if (v.is_undefined()) UndefinedError(v, line);
  if (!v.is_number()) TypeError(std::string("bad operand type for unary ") + (minus ? "-" : "+") + ": '" + v.TypeName() + "'", line);
  if (!minus) return v.kind() == K::kBool ? Value::Int(v.as_int()) : v;
  if (v.kind() == K::kFloat) return Value::Float(-v.as_double());
  if (v.as_int() == INT64_MIN) Overflow(line);
  return Value::Int(-v.as_int());
}

}  // namespace ferry::gateway::jinja
