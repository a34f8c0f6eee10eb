// The values a chat template computes with, with Python's semantics as Jinja2 gives them (jinja2
// runs on Python objects): None, bool, int, float, str (UTF-8, indexed by code point), list, dict
// (insertion-ordered, string keys), a namespace (the one mutable object), callables, and
// Undefined (a name or key that is not there: prints as "", is false, iterates as nothing, and
// fails on anything else, as jinja2's default Undefined).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ferry::gateway::jinja {

// A template error: the message as jinja2 would give it, and the template line (0: unknown).
struct Error {
  std::string message;
  int line = 0;
};

class Value;
using List = std::vector<Value>;

class Dict;

struct CallArgs;
using Function = std::function<Value(CallArgs&)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kCallable };

  Value() = default;  // Undefined
  static Value Undefined(std::string name) {
    Value v;
    v.str_ = std::make_shared<const std::string>(std::move(name));
    return v;
  }
  static Value None() { return Value(Kind::kNone); }
  static Value Bool(bool b) {
    Value v(Kind::kBool);
    v.int_ = b;
    return v;
  }
  static Value Int(int64_t i) {
    Value v(Kind::kInt);
    v.int_ = i;
    return v;
  }
  static Value Float(double d) {
    Value v(Kind::kFloat);
    v.float_ = d;
    return v;
  }
  static Value String(std::string s) {
    Value v(Kind::kString);
    v.str_ = std::make_shared<const std::string>(std::move(s));
    return v;
  }
  // Lists, tuples and dicts nest at most kMaxDepth deep (an Error past it): a template building
  // [[[...]]] in a loop must not make a value whose printing or freeing recurses without bound.
  static constexpr int kMaxDepth = 256;
  static Value MakeList(List items) {
    Value v(Kind::kList);
    v.Nest(items);
    v.list_ = std::make_shared<const List>(std::move(items));
    return v;
  }
  // A tuple is a list that prints as one: ("a", 1); Python never equates it with a list.
  static Value MakeTuple(List items) {
    Value v = MakeList(std::move(items));
    v.tuple_ = true;
    return v;
  }
  static Value MakeDict(Dict d);
  static Value Namespace(Dict d);
  static Value Callable(std::string name, Function fn) {
    Value v(Kind::kCallable);
    v.str_ = std::make_shared<const std::string>(std::move(name));
    v.fn_ = std::make_shared<const Function>(std::move(fn));
    return v;
  }
  // JSON as Python's json.loads gives it (objects keep their key order).
  static Value FromJson(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_list() const { return kind_ == Kind::kList; }  // a list or a tuple
  bool is_tuple() const { return tuple_; }
  // A namespace is somewhere inside (a namespace may not hold one: no reference cycles).
  bool holds_namespace() const { return holds_namespace_ || kind_ == Kind::kNamespace; }
  bool is_dict() const { return kind_ == Kind::kDict || kind_ == Kind::kNamespace; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }  // int or bool
  double as_double() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(int_); }
  const std::string& str() const { return *str_; }  // string; an Undefined's name; a callable's name
  const List& list() const { return *list_; }
  const Dict& dict() const { return *dict_; }
  Dict& mutable_namespace() const { return *dict_; }  // kNamespace only: `set ns.attr = ...`
  const Function& function() const { return *fn_; }

  // Python's bool(value).
  bool Truthy() const;
  // Python's type name, for errors: "str", "dict", "NoneType", ...
  const char* TypeName() const;  // "list" or "tuple", "dict", "NoneType", ...

 private:
  explicit Value(Kind k) : kind_(k) {}
  template <typename Items>
  void Nest(const Items& items);
  static const Value& Item(const Value& v) { return v; }
  static const Value& Item(const std::pair<std::string, Value>& kv) { return kv.second; }

  Kind kind_ = Kind::kUndefined;
  bool tuple_ = false;
  bool holds_namespace_ = false;
  int depth_ = 0;  // 0: not a container
  int64_t int_ = 0;
  double float_ = 0;
  std::shared_ptr<const std::string> str_;
  std::shared_ptr<const List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const Function> fn_;
};

// Insertion-ordered string-keyed map, as a Python dict built from JSON.
class Dict {
 public:
  const Value* Find(const std::string& key) const;
  void Set(const std::string& key, Value value);
  const std::vector<std::pair<std::string, Value>>& items() const { return items_; }
  size_t size() const { return items_.size(); }

 private:
  std::vector<std::pair<std::string, Value>> items_;
};

template <typename Items>
void Value::Nest(const Items& items) {
  int deepest = 0;
  for (const auto& item : items) {
    const Value& e = Item(item);
    deepest = e.depth_ > deepest ? e.depth_ : deepest;
    holds_namespace_ = holds_namespace_ || e.holds_namespace();
  }
  depth_ = deepest + 1;
  if (depth_ > kMaxDepth) throw Error{"a value nests deeper than " + std::to_string(kMaxDepth) + " levels"};
}

inline Value Value::MakeDict(Dict d) {
  Value v(Kind::kDict);
  v.Nest(d.items());
  v.dict_ = std::make_shared<Dict>(std::move(d));
  return v;
}

inline Value Value::Namespace(Dict d) {
  Value v = MakeDict(std::move(d));
  v.kind_ = Kind::kNamespace;
  return v;
}

// A call's arguments: positional, then keyword (in the call's order).
struct CallArgs {
  List positional;
  std::vector<std::pair<std::string, Value>> keyword;
  int line = 0;
};

// Python's ==, as jinja2 compares (1 == 1.0 == True; lists and dicts deeply).
bool Equal(const Value& a, const Value& b);

// Python's hashability: what may be a dict key or a set member (not a list, dict or namespace,
// nor a tuple holding one).
bool Hashable(const Value& v);

// str(value) as Jinja prints it ({{ x }}): Undefined as "", None as "None", floats as repr.
std::string ToStr(const Value& v);
// repr(value): strings quoted as Python does.
std::string Repr(const Value& v);
// Python's repr of a float ("1.0", "1e+20", "0.1", "inf", "nan").
std::string FloatRepr(double d);
// json.dumps(value, ensure_ascii, indent, separators, sort_keys): transformers' tojson.
struct JsonOptions {
  bool ensure_ascii = false;
  int indent = -1;  // -1: None (one line)
  std::string item_separator;  // empty: Python's default for the indent
  std::string key_separator;
  bool sort_keys = false;
};
std::string ToJson(const Value& v, const JsonOptions& options);

// Code-point views of a UTF-8 string (Python's str is indexed by code point).
std::vector<std::string> CodePoints(const std::string& s);
size_t CodePointCount(const std::string& s);

}  // namespace ferry::gateway::jinja
