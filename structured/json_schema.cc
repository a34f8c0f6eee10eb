#include "structured/json_schema.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <tuple>

#include "structured/compile_cache.h"
#include "structured/json_number_range.h"
#include "structured/json_string_dfa.h"

namespace ferry {
namespace {

// ordered: properties are generated in the schema's order, so objects keep the text's order.
using json = nlohmann::ordered_json;

// Assertions the automaton cannot keep: refused rather than ignored, since a text that breaks
// them would not validate.
const std::set<std::string>& Refused() {
  static const std::set<std::string> kRefused = {
      "multipleOf", "minProperties", "maxProperties", "patternProperties", "propertyNames", "uniqueItems",
      "contains", "minContains", "maxContains", "not", "if", "then", "else",
      "dependentRequired", "dependentSchemas", "dependencies", "unevaluatedProperties", "unevaluatedItems",
      "$dynamicRef", "$recursiveRef", "contentSchema"};
  return kRefused;
}

// Keywords that only describe: allowed anywhere, beside $ref and anyOf too.
bool IsAnnotation(const std::string& key) {
  static const std::set<std::string> kAnnotations = {
      "title", "description", "default", "examples", "$schema", "$id", "$anchor", "$comment", "$defs",
      "definitions", "deprecated", "readOnly", "writeOnly", "contentEncoding", "contentMediaType", "strict",
      "discriminator"};  // OpenAPI's hint beside a oneOf: the tag is found from the objects themselves
  return kAnnotations.count(key) > 0;
}

// The JSON type of a value, as JSON Schema names it ("integer" for whole numbers).
bool HasType(const json& v, const std::string& type) {
  if (type == "integer") {
    return v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                     std::floor(v.get<double>()) == v.get<double>());
  }
  if (type == "number") return v.is_number();
  if (type == "string") return v.is_string();
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  return false;
}

std::string Quoted(const std::string& s) { return json(s).dump(); }

class Compiler {
 public:
  explicit Compiler(const json& root) : root_(root) {}

  SchemaGraph Run() {
    graph_.root = Compile(root_, "");
    for (size_t i = 0; i < graph_.nodes.size(); ++i) FirstBytes(static_cast<int32_t>(i), 0);
    TagUnions();
    CheckUnions();
    return std::move(graph_);
  }

 private:
  [[noreturn]] static void Fail(const std::string& path, const std::string& what) {
    throw JsonSchemaError("schema at " + (path.empty() ? std::string("/") : path) + ": " + what);
  }

  int32_t NewNode(SchemaNode node, const std::string& path) {
    if (graph_.nodes.size() >= kMaxSchemaNodes) {
      Fail(path, "the schema needs more than " + std::to_string(kMaxSchemaNodes) + " nodes");
    }
    graph_.nodes.push_back(std::move(node));
    paths_.push_back(path);
    pending_.push_back(false);
    return static_cast<int32_t>(graph_.nodes.size() - 1);
  }

  int32_t Compile(const json& s, const std::string& path);
  int32_t Ref(const json& ref, const std::string& path);
  int32_t Literals(const json& values, const json& s, const std::string& path);
  int32_t Union(const json& alternatives, const std::string& key, const std::string& path);
  int32_t Typed(const json& s, const std::string& type, const std::string& path);
  int32_t Object(const json& s, const std::string& path);
  int32_t Array(const json& s, const std::string& path);
  int32_t String(const json& s, const std::string& path);
  int32_t Integer(const json& s, const std::string& path);
  int32_t Number(const json& s, const std::string& path);
  std::pair<int64_t, int64_t> CountBounds(const json& s, const char* min_key, const char* max_key,
                                          const std::string& path);
  std::vector<std::string> Types(const json& s, const std::string& path);
  void FirstBytes(int32_t id, int depth);
  std::optional<int32_t> TaggedObject(const std::vector<int32_t>& objects, const std::string& path);
  void TagUnions();
  void CheckUnions();

  const json& root_;
  SchemaGraph graph_;
  std::vector<std::string> paths_;  // by node, for errors found after compiling
  std::vector<bool> pending_;       // a $ref's node reserved while its target compiles
  std::vector<bool> first_done_;
  std::map<std::string, int32_t> refs_;
};

int32_t Compiler::Compile(const json& s, const std::string& path) {
  if (s.is_boolean()) {
    if (!s.get<bool>()) Fail(path, "the schema false accepts no value");
    return NewNode({}, path);
  }
  if (!s.is_object()) Fail(path, "a schema must be an object or a boolean, got " + std::string(s.type_name()));
  for (const auto& [key, value] : s.items()) {
    if (Refused().count(key)) Fail(path, "\"" + key + "\" is not supported");
  }
  auto only_annotations_beside = [&](const std::string& keyword) {
    for (const auto& [key, value] : s.items()) {
      if (key != keyword && !IsAnnotation(key)) Fail(path, "\"" + key + "\" beside \"" + keyword + "\" is not supported");
    }
  };
  if (s.contains("$ref")) {
    only_annotations_beside("$ref");
    return Ref(s["$ref"], path);
  }
  if (s.contains("allOf")) {  // pydantic wraps a described $ref in one; more would need merging
    only_annotations_beside("allOf");
    if (!s["allOf"].is_array() || s["allOf"].size() != 1) Fail(path, "\"allOf\" of other than one schema is not supported");
    return Compile(s["allOf"][0], path + "/allOf/0");
  }
  for (const char* keyword : {"anyOf", "oneOf"}) {
    if (s.contains(keyword)) {
      only_annotations_beside(keyword);
      return Union(s[keyword], keyword, path);
    }
  }
  if (s.contains("const") || s.contains("enum")) {
    for (const char* key : {"minLength", "maxLength", "pattern", "format"}) {
      if (s.contains(key)) Fail(path, "\"" + std::string(key) + "\" beside \"" + (s.contains("const") ? "const" : "enum") + "\" is not supported");
    }
  }
  if (s.contains("const")) return Literals(json::array({s["const"]}), s, path);
  if (s.contains("enum")) return Literals(s["enum"], s, path);
  const std::vector<std::string> types = Types(s, path);
  if (types.size() == 1) return Typed(s, types[0], path);
  SchemaNode u{.kind = SchemaNode::Kind::kUnion};
  for (const std::string& t : types) u.alternatives.push_back(Typed(s, t, path));
  return NewNode(std::move(u), path);
}

// The types a schema allows, "number" absorbing "integer"; inferred from its keywords when it
// names none (an untyped schema with properties accepts non-objects too, but an object is valid).
std::vector<std::string> Compiler::Types(const json& s, const std::string& path) {
  std::vector<std::string> types;
  if (!s.contains("type")) {
    if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) return {"object"};
    if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems")) return {"array"};
    for (const char* key : {"minLength", "maxLength", "pattern", "format"}) {
      if (s.contains(key)) return {"string"};
    }
    for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (s.contains(key)) return {"number"};
    }
    return {"any"};
  }
  const json& t = s["type"];
  const json list = t.is_array() ? t : json::array({t});
  if (list.empty()) Fail(path, "\"type\" is an empty list");
  static const std::set<std::string> kNames = {"object", "array", "string", "number", "integer", "boolean", "null"};
  for (const json& name : list) {
    if (!name.is_string() || !kNames.count(name.get<std::string>())) Fail(path, "\"type\" " + name.dump() + " is not a JSON Schema type");
    if (std::find(types.begin(), types.end(), name.get<std::string>()) == types.end()) types.push_back(name.get<std::string>());
  }
  if (std::count(types.begin(), types.end(), "number") && std::count(types.begin(), types.end(), "integer")) {
    std::erase(types, "integer");
  }
  return types;
}

int32_t Compiler::Ref(const json& ref, const std::string& path) {
  if (!ref.is_string()) Fail(path, "\"$ref\" must be a string");
  const std::string r = ref.get<std::string>();
  if (auto it = refs_.find(r); it != refs_.end()) return it->second;
  const json* target = nullptr;
  if (r == "#") {
    target = &root_;
  } else {
    for (const char* defs : {"$defs", "definitions"}) {
      const std::string prefix = std::string("#/") + defs + "/";
      if (r.rfind(prefix, 0) != 0) continue;
      std::string name = r.substr(prefix.size());
      for (size_t at; (at = name.find("~1")) != std::string::npos;) name.replace(at, 2, "/");
      for (size_t at; (at = name.find("~0")) != std::string::npos;) name.replace(at, 2, "~");
      if (root_.contains(defs) && root_[defs].is_object() && root_[defs].contains(name)) target = &root_[defs][name];
    }
  }
  if (target == nullptr) Fail(path, "\"$ref\" " + Quoted(r) + " is not \"#\" or a \"#/$defs/NAME\" that exists");
  // Reserved first, so that a recursive reference inside the target resolves to this node.
  const int32_t id = NewNode({}, path);
  refs_[r] = id;
  pending_[static_cast<size_t>(id)] = true;
  const int32_t compiled = Compile(*target, r.substr(1));
  if (pending_[static_cast<size_t>(compiled)]) Fail(path, "\"$ref\" " + Quoted(r) + " refers to itself without a value in between");
  graph_.nodes[static_cast<size_t>(id)] = graph_.nodes[static_cast<size_t>(compiled)];
  paths_[static_cast<size_t>(id)] = paths_[static_cast<size_t>(compiled)];
  pending_[static_cast<size_t>(id)] = false;
  return id;
}

int32_t Compiler::Literals(const json& values, const json& s, const std::string& path) {
  if (!values.is_array() || values.empty()) Fail(path, "\"enum\" must be a non-empty array");
  if (values.size() > kMaxSchemaLiterals) {
    Fail(path, "\"enum\" has " + std::to_string(values.size()) + " values, over the limit of " + std::to_string(kMaxSchemaLiterals));
  }
  const std::vector<std::string> types = s.contains("type") ? Types(s, path) : std::vector<std::string>{};
  SchemaNode node{.kind = SchemaNode::Kind::kLiterals};
  for (const json& v : values) {
    if (!types.empty() && std::none_of(types.begin(), types.end(), [&](const std::string& t) { return HasType(v, t); })) {
      Fail(path, "the value " + v.dump() + " is not of the schema's \"type\"");
    }
    std::string text = v.dump();
    if (text.size() > kMaxSchemaLiteralBytes) {
      Fail(path, "a value of " + std::to_string(text.size()) + " bytes, over the limit of " + std::to_string(kMaxSchemaLiteralBytes));
    }
    node.literals.push_back(std::move(text));
  }
  std::sort(node.literals.begin(), node.literals.end());
  node.literals.erase(std::unique(node.literals.begin(), node.literals.end()), node.literals.end());
  return NewNode(std::move(node), path);
}

int32_t Compiler::Union(const json& alternatives, const std::string& key, const std::string& path) {
  if (!alternatives.is_array() || alternatives.empty()) Fail(path, "\"" + key + "\" must be a non-empty array");
  if (alternatives.size() == 1) return Compile(alternatives[0], path + "/" + key + "/0");
  SchemaNode u{.kind = SchemaNode::Kind::kUnion};
  for (size_t i = 0; i < alternatives.size(); ++i) {
    u.alternatives.push_back(Compile(alternatives[i], path + "/" + key + "/" + std::to_string(i)));
  }
  return NewNode(std::move(u), path);
}

int32_t Compiler::Typed(const json& s, const std::string& type, const std::string& path) {
  using Kind = SchemaNode::Kind;
  if (type == "object") return Object(s, path);
  if (type == "array") return Array(s, path);
  if (type == "string") return String(s, path);
  // A format asserts on strings only, but OpenAPI's int32, float, ... on numbers assert what
  // the automaton cannot keep.
  if ((type == "number" || type == "integer") && s.contains("format")) {
    Fail(path, "\"format\" on a " + type + " is not supported");
  }
  if (type == "number") return Number(s, path);
  if (type == "integer") return Integer(s, path);
  if (type == "boolean") return NewNode({.kind = Kind::kLiterals, .literals = {"false", "true"}}, path);
  if (type == "null") return NewNode({.kind = Kind::kLiterals, .literals = {"null"}}, path);
  return NewNode({.kind = Kind::kAnyValue}, path);
}

// An integer's bounds, as JSON Schema writes them (numbers; draft 4: exclusive* booleans beside
// minimum / maximum), narrowed to whole numbers; a bounded integer is a DFA of its range's texts.
int32_t Compiler::Integer(const json& s, const std::string& path) {
  SchemaNode node{.kind = SchemaNode::Kind::kInteger};
  std::optional<double> lo, hi;  // inclusive, whole
  auto bound = [&](const char* key) -> std::optional<double> {
    if (!s.contains(key) || s[key].is_boolean()) return std::nullopt;
    if (!s[key].is_number()) Fail(path, "\"" + std::string(key) + "\" must be a number");
    const double v = s[key].get<double>();
    if (!(std::fabs(v) < 9.0e18)) Fail(path, "\"" + std::string(key) + "\" " + s[key].dump() + " is past the 64-bit integers");
    return v;
  };
  const bool draft4_lo = s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_boolean() && s["exclusiveMinimum"].get<bool>();
  const bool draft4_hi = s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_boolean() && s["exclusiveMaximum"].get<bool>();
  if (auto v = bound("minimum")) lo = draft4_lo ? std::floor(*v) + 1 : std::ceil(*v);
  if (auto v = bound("exclusiveMinimum")) lo = std::max(lo.value_or(*v), std::floor(*v) + 1);
  if (auto v = bound("maximum")) hi = draft4_hi ? std::ceil(*v) - 1 : std::floor(*v);
  if (auto v = bound("exclusiveMaximum")) hi = std::min(hi.value_or(*v), std::ceil(*v) - 1);
  if (!lo && !hi) return NewNode(std::move(node), path);
  if (lo && hi && *lo > *hi) Fail(path, "no integer lies between the schema's bounds");
  const auto whole = [](std::optional<double> v) { return v ? std::optional<int64_t>(static_cast<int64_t>(*v)) : std::nullopt; };
  try {
    auto dfa = std::make_shared<const RegexDfa>(CompileRegex(IntegerRangeRegex(whole(lo), whole(hi))));
    node.dfa = static_cast<int32_t>(graph_.dfas.size());
    graph_.dfas.push_back(std::move(dfa));
  } catch (const RegexError& e) {
    Fail(path, std::string("the integer range: ") + e.what());
  }
  return NewNode(std::move(node), path);
}

// A number's bounds: the tighter of minimum and exclusiveMinimum (and of the maxima), draft 4's
// booleans read as well; a bounded number is a DFA of plain decimals in range
// (json_number_range.h).
int32_t Compiler::Number(const json& s, const std::string& path) {
  SchemaNode node{.kind = SchemaNode::Kind::kNumber};
  auto pick = [&](const char* inclusive, const char* exclusive, bool lower) -> std::optional<NumberBound> {
    std::optional<NumberBound> out;
    for (const char* key : {inclusive, exclusive}) {
      if (!s.contains(key) || s[key].is_boolean()) continue;
      if (!s[key].is_number()) Fail(path, "\"" + std::string(key) + "\" must be a number");
      const bool excl = key == exclusive || (s.contains(exclusive) && s[exclusive].is_boolean() && s[exclusive].get<bool>());
      const double v = s[key].get<double>();
      const bool tighter = !out || (lower ? v > std::stod(out->text) : v < std::stod(out->text)) ||
                           (v == std::stod(out->text) && excl);
      if (tighter) out = NumberBound{s[key].dump(), excl};
    }
    return out;
  };
  const std::optional<NumberBound> lo = pick("minimum", "exclusiveMinimum", true);
  const std::optional<NumberBound> hi = pick("maximum", "exclusiveMaximum", false);
  if (!lo && !hi) return NewNode(std::move(node), path);
  try {
    auto dfa = std::make_shared<const RegexDfa>(NumberRangeDfa(lo, hi));
    node.dfa = static_cast<int32_t>(graph_.dfas.size());
    graph_.dfas.push_back(std::move(dfa));
  } catch (const std::invalid_argument& e) {
    Fail(path, std::string("the number range: ") + e.what());
  }
  return NewNode(std::move(node), path);
}

// A pair of count keywords (minLength / maxLength, minItems / maxItems): non-negative integers,
// the maximum not below the minimum. Returns (min, max), max -1 when absent.
std::pair<int64_t, int64_t> Compiler::CountBounds(const json& s, const char* min_key, const char* max_key,
                                                  const std::string& path) {
  for (const char* key : {min_key, max_key}) {
    if (!s.contains(key)) continue;
    if (!s[key].is_number_integer() || s[key].get<int64_t>() < 0) Fail(path, "\"" + std::string(key) + "\" must be a non-negative integer");
  }
  const int64_t min = s.value(min_key, int64_t{0}), max = s.value(max_key, int64_t{-1});
  if (max >= 0 && max < min) Fail(path, "\"" + std::string(max_key) + "\" is below \"" + min_key + "\"");
  return {min, max};
}

// A string's lengths, pattern and format; a pattern or format becomes a DFA over its JSON text
// (json_string_dfa.h), with the lengths in it.
int32_t Compiler::String(const json& s, const std::string& path) {
  SchemaNode node{.kind = SchemaNode::Kind::kString};
  std::tie(node.min_length, node.max_length) = CountBounds(s, "minLength", "maxLength", path);
  std::vector<std::string> regexes;
  if (s.contains("pattern")) {
    if (!s["pattern"].is_string()) Fail(path, "\"pattern\" must be a string");
    const std::string pattern = s["pattern"].get<std::string>();
    try {
      CompileRegexCached(pattern);  // its own errors, with offsets in the pattern as written
    } catch (const RegexError& e) {
      Fail(path, std::string("\"pattern\": ") + e.what());
    }
    regexes.push_back(PatternContentRegex(pattern));
  }
  if (s.contains("format")) {
    if (!s["format"].is_string()) Fail(path, "\"format\" must be a string");
    const std::optional<std::string> regex = FormatContentRegex(s["format"].get<std::string>());
    if (!regex) {
      Fail(path, "\"format\" " + s["format"].dump() +
                     " is not supported (served: date, time, date-time, email, uuid, ipv4, uri)");
    }
    regexes.push_back(*regex);
  }
  if (!regexes.empty()) {
    try {
      auto dfa = std::make_shared<const RegexDfa>(JsonStringDfa(regexes, node.min_length, node.max_length, &node.max_length));
      node.dfa = static_cast<int32_t>(graph_.dfas.size());
      graph_.dfas.push_back(std::move(dfa));
    } catch (const RegexError& e) {
      Fail(path, std::string(s.contains("pattern") ? "\"pattern\"" : "\"format\"") + ": " + e.what());
    }
  }
  return NewNode(std::move(node), path);
}

int32_t Compiler::Object(const json& s, const std::string& path) {
  bool closed = false;  // additionalProperties false
  if (s.contains("additionalProperties")) {
    const json& a = s["additionalProperties"];
    if (a.is_boolean()) {
      closed = !a.get<bool>();
    } else if (!(a.is_object() && a.empty())) {
      Fail(path, "\"additionalProperties\" must be true or false (a schema there is not supported)");
    }
  }
  std::set<std::string> required;
  if (s.contains("required")) {
    if (!s["required"].is_array()) Fail(path, "\"required\" must be an array of names");
    for (const json& name : s["required"]) {
      if (!name.is_string()) Fail(path, "\"required\" must be an array of names");
      required.insert(name.get<std::string>());
    }
  }
  const json no_properties = json::object();
  const json& props = s.contains("properties") ? s["properties"] : no_properties;
  if (!props.is_object()) Fail(path, "\"properties\" must be an object");
  for (const std::string& name : required) {
    if (!props.contains(name)) Fail(path, "required property " + Quoted(name) + " is not in \"properties\"");
  }
  if (props.empty() && !closed) return NewNode({.kind = SchemaNode::Kind::kAnyObject}, path);
  if (props.size() > kMaxSchemaProperties) {
    Fail(path, std::to_string(props.size()) + " properties, over the limit of " + std::to_string(kMaxSchemaProperties));
  }
  SchemaNode node{.kind = SchemaNode::Kind::kObject};
  // In the text's order (ordered_json), as OpenAI's structured outputs write them.
  for (const auto& [name, sub] : props.items()) {
    const int32_t child = Compile(sub, path + "/properties/" + name);
    node.properties.push_back({Quoted(name), child, required.count(name) > 0});
  }
  return NewNode(std::move(node), path);
}

int32_t Compiler::Array(const json& s, const std::string& path) {
  SchemaNode node{.kind = SchemaNode::Kind::kArray};
  std::tie(node.min_items, node.max_items) = CountBounds(s, "minItems", "maxItems", path);
  // Tuples: prefixItems (2020-12, pydantic's tuple[...]) or a list under "items" (earlier drafts,
  // the rest then under additionalItems); the items past them follow "items" (or additionalItems).
  const bool list = s.contains("items") && s["items"].is_array();
  if (s.contains("prefixItems") && list) Fail(path, "\"prefixItems\" beside a list under \"items\"");
  const char* prefix_key = list ? "items" : "prefixItems";
  const char* rest_key = list ? "additionalItems" : "items";
  if (s.contains(prefix_key)) {
    if (!s[prefix_key].is_array()) Fail(path, "\"" + std::string(prefix_key) + "\" must be an array");
    for (size_t i = 0; i < s[prefix_key].size(); ++i) {
      node.prefix_items.push_back(Compile(s[prefix_key][i], path + "/" + prefix_key + "/" + std::to_string(i)));
    }
  }
  if (s.contains(rest_key) && s[rest_key].is_boolean() && !s[rest_key].get<bool>()) {  // nothing past the prefix
    const auto fixed = static_cast<int64_t>(node.prefix_items.size());
    if (node.min_items > fixed) Fail(path, "\"minItems\" is above the " + std::to_string(fixed) + " items allowed");
    node.max_items = node.max_items < 0 ? fixed : std::min(node.max_items, fixed);
    node.items = NewNode({}, path + "/" + rest_key);
  } else {
    node.items = s.contains(rest_key) ? Compile(s[rest_key], path + "/" + rest_key) : NewNode({}, path + "/" + rest_key);
  }
  return NewNode(std::move(node), path);
}

// first_bytes of node id (and of every union below it). depth bounds a union that contains
// itself, which has no first byte at all.
void Compiler::FirstBytes(int32_t id, int depth) {
  if (first_done_.size() < graph_.nodes.size()) first_done_.resize(graph_.nodes.size(), false);
  if (first_done_[static_cast<size_t>(id)]) return;
  if (depth > static_cast<int>(kMaxSchemaNodes)) Fail(paths_[static_cast<size_t>(id)], "\"anyOf\" contains itself");
  SchemaNode& n = graph_.nodes[static_cast<size_t>(id)];
  std::bitset<256> b;
  auto number = [&] {
    b.set('-');
    for (char c = '0'; c <= '9'; ++c) b.set(static_cast<uint8_t>(c));
  };
  switch (n.kind) {
    case SchemaNode::Kind::kAnyValue:
      for (char c : std::string("{[\"tfn")) b.set(static_cast<uint8_t>(c));
      number();
      break;
    case SchemaNode::Kind::kAnyObject:
    case SchemaNode::Kind::kObject: b.set('{'); break;
    case SchemaNode::Kind::kArray: b.set('['); break;
    case SchemaNode::Kind::kString: b.set('"'); break;
    case SchemaNode::Kind::kNumber:
    case SchemaNode::Kind::kInteger:
      if (n.dfa < 0) {
        number();
        break;
      }
      for (int c = 0; c < 256; ++c) {  // what the range's texts begin with
        if (graph_.dfas[static_cast<size_t>(n.dfa)]->Step(graph_.dfas[static_cast<size_t>(n.dfa)]->start, static_cast<uint8_t>(c)) >= 0) b.set(static_cast<size_t>(c));
      }
      break;
    case SchemaNode::Kind::kLiterals:
      for (const std::string& l : n.literals) b.set(static_cast<uint8_t>(l[0]));
      break;
    case SchemaNode::Kind::kUnion:
      for (int32_t alt : n.alternatives) {
        FirstBytes(alt, depth + 1);
        b |= graph_.nodes[static_cast<size_t>(alt)].first_bytes;
      }
      break;
  }
  graph_.nodes[static_cast<size_t>(id)].first_bytes = b;
  first_done_[static_cast<size_t>(id)] = true;
}

// The tagged object standing for `objects` (kObject nodes that all start with '{'), when they
// are told apart by their first property; nullopt when they are not.
std::optional<int32_t> Compiler::TaggedObject(const std::vector<int32_t>& objects, const std::string& path) {
  std::vector<std::pair<std::string, int32_t>> tags;  // (value, object)
  const SchemaNode& first = graph_.nodes[static_cast<size_t>(objects[0])];
  if (first.properties.empty()) return std::nullopt;
  const std::string key = first.properties[0].key;
  for (int32_t id : objects) {
    const SchemaNode& o = graph_.nodes[static_cast<size_t>(id)];
    if (o.kind != SchemaNode::Kind::kObject || !o.tag_targets.empty() || o.properties.empty() ||
        o.properties[0].key != key || !o.properties[0].required) {
      return std::nullopt;
    }
    const SchemaNode& tag = graph_.nodes[static_cast<size_t>(o.properties[0].node)];
    if (tag.kind != SchemaNode::Kind::kLiterals) return std::nullopt;
    for (const std::string& value : tag.literals) {
      // A JSON string is never a prefix of another, so the tag's value ends where it closes.
      if (value[0] != '"') return std::nullopt;
      tags.emplace_back(value, id);
    }
  }
  std::sort(tags.begin(), tags.end());
  for (size_t i = 1; i < tags.size(); ++i) {
    if (tags[i].first == tags[i - 1].first) return std::nullopt;  // two objects share a value
  }
  if (tags.size() > kMaxSchemaLiterals) return std::nullopt;
  SchemaNode values{.kind = SchemaNode::Kind::kLiterals};
  SchemaNode tagged{.kind = SchemaNode::Kind::kObject};
  for (auto& [value, id] : tags) values.literals.push_back(value), tagged.tag_targets.push_back(id);
  values.first_bytes.set('"');
  const int32_t values_id = NewNode(std::move(values), path);
  tagged.properties.push_back({key, values_id, true});
  tagged.first_bytes.set('{');
  return NewNode(std::move(tagged), path);
}

// A union's alternatives that are objects all starting the same way become one tagged object
// (SchemaNode::tag_targets) when their first property tells them apart; CheckUnions then finds
// the union's alternatives starting differently, or names the ones that do not.
void Compiler::TagUnions() {
  const size_t compiled = graph_.nodes.size();  // the nodes TaggedObject adds are no unions
  for (size_t i = 0; i < compiled; ++i) {
    if (graph_.nodes[i].kind != SchemaNode::Kind::kUnion) continue;
    std::vector<int32_t> objects, rest;
    for (int32_t alt : graph_.nodes[i].alternatives) {
      (graph_.nodes[static_cast<size_t>(alt)].first_bytes.test('{') ? objects : rest).push_back(alt);
    }
    if (objects.size() < 2) continue;
    const std::optional<int32_t> tagged = TaggedObject(objects, paths_[i]);
    if (!tagged) continue;
    rest.push_back(*tagged);
    first_done_.resize(graph_.nodes.size(), true);
    graph_.nodes[i].alternatives = std::move(rest);
  }
}

void Compiler::CheckUnions() {
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const SchemaNode& n = graph_.nodes[i];
    std::bitset<256> seen;
    for (int32_t alt : n.alternatives) {
      const std::bitset<256>& b = graph_.nodes[static_cast<size_t>(alt)].first_bytes;
      if ((seen & b).any()) {
        Fail(paths_[i], "\"anyOf\" alternatives must differ in how they start (two of them can start the same "
                        "way, e.g. two strings, or two objects not told apart by a first property each "
                        "requires with its own string values); merge them or use \"enum\"");
      }
      seen |= b;
    }
  }
}

}  // namespace

SchemaGraph CompileJsonSchema(const std::string& schema_json) {
  json schema;
  try {
    schema = json::parse(schema_json);
  } catch (const nlohmann::json::exception& e) {
    throw JsonSchemaError(std::string("schema is not JSON: ") + e.what());
  }
  return Compiler(schema).Run();
}

std::shared_ptr<const SchemaGraph> CompileJsonSchemaCached(const std::string& schema_json) {
  static CompileCache<SchemaGraph> cache(32);
  return cache.Get(schema_json, CompileJsonSchema);
}

}  // namespace ferry
