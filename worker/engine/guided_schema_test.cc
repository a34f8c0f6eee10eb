// The JSON Schema automaton: texts valid under the schema (properties in its order) are taken
// whole, and every text it takes whole is valid; checked on hand-picked texts and, against a
// validator written from the schema graph, on random instances and their mutations.
#include "worker/engine/guided_schema.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>

#include "worker/engine/guided_decoding.h"
#include "worker/engine/guided_test_util.h"

namespace ferry::worker {
namespace {

using Kind = SchemaNode::Kind;
using ordered_json = nlohmann::ordered_json;

bool Accepts(const SchemaGraph& g, const std::string& text) {
  SchemaAutomaton a(&g);
  for (char c : text) {
    if (!a.Feed(static_cast<uint8_t>(c))) return false;
  }
  return a.Accepted();
}

const char* kPerson = R"({
  "type": "object", "additionalProperties": false,
  "properties": {
    "name": {"type": "string"},
    "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
    "status": {"enum": ["active", "gone"]},
    "score": {"type": ["number", "null"]},
    "extra": {"type": "object"}
  },
  "required": ["name", "status"]})";

// Tool calls, as tool_choice "required" asks for them: objects told apart by their "name".
const char* kCalls = R"({"type": "array", "minItems": 1, "items": {"anyOf": [
  {"type": "object", "properties": {"name": {"enum": ["get_weather"]}, "parameters": {"type": "object",
   "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"],
   "additionalProperties": false}}, "required": ["name", "parameters"], "additionalProperties": false},
  {"type": "object", "properties": {"name": {"const": "get_time"}, "parameters": {"type": "object",
   "properties": {"zone": {"enum": ["utc", "local"]}}, "additionalProperties": false}},
   "required": ["name", "parameters"], "additionalProperties": false},
  {"type": "object", "properties": {"name": {"enum": ["a", "get"]}, "parameters": {"type": "boolean"}},
   "required": ["name", "parameters"]},
  {"type": "null"}]}})";

TEST(SchemaAutomatonTest, TaggedUnionsFollowTheObjectTheirTagNames) {
  const SchemaGraph g = CompileJsonSchema(kCalls);
  for (const char* ok : {R"([{"name":"get_weather","parameters":{"city":"Oslo","days":3}}])",
                         R"([{"name":"get_time","parameters":{"zone":"utc"}},null,{"name":"a","parameters":true}])",
                         R"([{"name":"get","parameters":false}])", R"([{"name":"get_time","parameters":{}}])"}) {
    EXPECT_TRUE(Accepts(g, ok)) << ok;
  }
  for (const char* bad : {R"([{"name":"get_weather","parameters":{"zone":"utc"}}])",  // get_time's parameters
                          R"([{"name":"get_time","parameters":{"city":"Oslo"}}])",
                          R"([{"name":"get_weather","parameters":true}])", R"([{"name":"other","parameters":{}}])",
                          R"([{"parameters":{},"name":"get_time"}])", R"([{"name":"get_time"}])", "[]"}) {
    EXPECT_FALSE(Accepts(g, bad)) << bad;
  }
  // Objects that no first property tells apart are still refused, naming the union.
  for (const char* refused : {
           R"({"anyOf": [{"properties": {"k": {"const": "x"}}, "required": ["k"]}, {"properties": {"k": {"const": "x"}}, "required": ["k"]}]})",
           R"({"anyOf": [{"properties": {"k": {"const": "x"}}}, {"properties": {"k": {"const": "y"}}}]})",
           R"({"anyOf": [{"properties": {"k": {"const": 1}}, "required": ["k"]}, {"properties": {"k": {"const": 2}}, "required": ["k"]}]})",
           R"({"anyOf": [{"properties": {"k": {"const": "x"}}, "required": ["k"]}, {"properties": {"j": {"const": "y"}}, "required": ["j"]}]})"}) {
    EXPECT_THROW(
        try { CompileJsonSchema(refused); } catch (const JsonSchemaError& e) {
          EXPECT_NE(std::string(e.what()).find("\"anyOf\" alternatives must differ"), std::string::npos) << e.what();
          throw;
        },
        JsonSchemaError)
        << refused;
  }
}

TEST(SchemaAutomatonTest, TakesValidTextsInTheSchemasOrder) {
  const SchemaGraph g = CompileJsonSchema(kPerson);
  for (const std::string text : {
           R"({"name":"Bo","status":"active"})", R"({"name": "Bo", "age": -3, "status": "gone"})",
           R"({"name":"","tags":[],"status":"gone","score":null})", R"({"name":"x","tags":["a","b"],"status":"gone","score":1.5e3})",
           R"({"name":"x","status":"gone","extra":{"any":[1,{"deep":true}]}})", "{\n  \"name\": \"\\u00e9\",\n  \"status\": \"active\"\n}"}) {
    EXPECT_TRUE(Accepts(g, text)) << text;
  }
  for (const std::string text : {
           R"({"status":"active","name":"Bo"})",          // out of order
           R"({"name":"Bo"})",                            // status is required
           R"({"name":"Bo","status":"active","x":1})",    // not a property
           R"({"name":"Bo","age":4.5,"status":"gone"})",  // not an integer
           R"({"name":"Bo","tags":["a","b","c"],"status":"gone"})",  // maxItems
           R"({"name":"Bo","status":"other"})", R"({"name":1,"status":"gone"})", R"({"name":"Bo","status":"gone"} )",
           R"([])", R"({"name":"Bo","status":"gone","score":nul})"}) {
    EXPECT_FALSE(Accepts(g, text)) << text;
  }
}

TEST(SchemaAutomatonTest, OptionalPropertiesMaySkipButNotReorder) {
  const SchemaGraph g = CompileJsonSchema(
      R"({"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}}, "required": ["b"]})");
  for (const char* ok : {R"({"b":1})", R"({"a":1,"b":2})", R"({"b":1,"c":2})", R"({"a":1,"b":2,"c":3})"}) EXPECT_TRUE(Accepts(g, ok)) << ok;
  for (const char* bad : {"{}", R"({"a":1})", R"({"c":1,"b":2})", R"({"b":1,"a":2})", R"({"a":1,"c":2})", R"({"b":1,})"}) {
    EXPECT_FALSE(Accepts(g, bad)) << bad;
  }
}

TEST(SchemaAutomatonTest, LiteralsThatExtendEachOtherEndOnTheNextByte) {
  const SchemaGraph g = CompileJsonSchema(R"({"enum": [1, 12, "x", true]})");
  for (const char* ok : {"1", "12", "\"x\"", "true", "  12"}) EXPECT_TRUE(Accepts(g, ok)) << ok;
  for (const char* bad : {"123", "2", "\"x\" ", "tru", "1 "}) EXPECT_FALSE(Accepts(g, bad)) << bad;
  const SchemaGraph arr = CompileJsonSchema(R"({"type": "array", "items": {"enum": [1, 12]}, "minItems": 2})");
  for (const char* ok : {"[1,12]", "[12, 1]", "[1 ,1,12]"}) EXPECT_TRUE(Accepts(arr, ok)) << ok;
  for (const char* bad : {"[1]", "[]", "[13,1]", "[1,]"}) EXPECT_FALSE(Accepts(arr, bad)) << bad;
}

TEST(SchemaAutomatonTest, UnionsPickTheirAlternativeByTheFirstByte) {
  const SchemaGraph g = CompileJsonSchema(R"({"anyOf": [{"type": "integer"}, {"type": "null"}, {"type": "array", "items": {"type": "string"}}]})");
  for (const char* ok : {"-5", "0", "null", "[]", R"(["a"])"}) EXPECT_TRUE(Accepts(g, ok)) << ok;
  for (const char* bad : {"1.5", "01", "[1]", "\"a\"", "{}"}) EXPECT_FALSE(Accepts(g, bad)) << bad;
}

TEST(SchemaAutomatonTest, RecursionStopsAtTheDepthLimit) {
  const SchemaGraph g = CompileJsonSchema(R"({"type": "array", "items": {"$ref": "#"}})");
  std::string ok, too_deep;
  for (size_t i = 0; i < SchemaAutomaton::kMaxDepth; ++i) ok = "[" + ok + "]";
  EXPECT_TRUE(Accepts(g, ok));
  EXPECT_FALSE(Accepts(g, "[" + ok + "]"));
}

TEST(SchemaAutomatonTest, FailedFeedLeavesTheStateAsItWas) {
  const SchemaGraph g = CompileJsonSchema(R"({"properties": {"n": {"enum": [1, 12]}, "m": {"type": "number"}}})");
  SchemaAutomaton a(&g);
  for (char c : std::string(R"({"n":1)")) ASSERT_TRUE(a.Feed(static_cast<uint8_t>(c)));
  const std::string key = a.Key();
  EXPECT_FALSE(a.Feed('3'));
  EXPECT_FALSE(a.Feed(']'));  // ends the literal, then is rejected after it
  EXPECT_EQ(a.Key(), key);
  for (char c : std::string(R"(,"m":2.5})")) ASSERT_TRUE(a.Feed(static_cast<uint8_t>(c)));
  EXPECT_TRUE(a.Accepted());
}

// ---------------------------------------------------------------------------------------------
// Random instances and mutations against a validator of the graph

ordered_json Instance(const SchemaGraph& g, int32_t id, std::mt19937& rng, int depth) {
  const SchemaNode& n = g.nodes[static_cast<size_t>(id)];
  if (!n.tag_targets.empty()) return Instance(g, n.tag_targets[rng() % n.tag_targets.size()], rng, depth);
  switch (n.kind) {
    case Kind::kObject: {
      ordered_json o = ordered_json::object();
      for (const auto& p : n.properties) {
        if (p.required || rng() % 2) o[ordered_json::parse(p.key).get<std::string>()] = Instance(g, p.node, rng, depth + 1);
      }
      return o;
    }
    case Kind::kArray: {
      ordered_json a = ordered_json::array();
      const int64_t max = n.max_items >= 0 ? n.max_items : n.min_items + 3;
      const int64_t count = depth > 6 ? n.min_items : n.min_items + static_cast<int64_t>(rng() % static_cast<unsigned>(max - n.min_items + 1));
      for (int64_t i = 0; i < count; ++i) {
        const auto at = static_cast<size_t>(i);
        a.push_back(Instance(g, at < n.prefix_items.size() ? n.prefix_items[at] : n.items, rng, depth + 1));
      }
      return a;
    }
    case Kind::kString: {
      static const char* const kUnits[] = {"s", "\"", "\\", "\n", "\xC3\xA9"};
      std::string out;
      for (unsigned k = rng() % 4; k-- > 0;) out += kUnits[rng() % 5];
      return out;
    }
    case Kind::kNumber: return (static_cast<double>(rng() % 2001) - 1000) / 8;
    case Kind::kInteger: return static_cast<int64_t>(rng() % 2001) - 1000;
    case Kind::kLiterals: return ordered_json::parse(n.literals[rng() % n.literals.size()]);
    case Kind::kUnion: return Instance(g, n.alternatives[rng() % n.alternatives.size()], rng, depth);
    case Kind::kAnyObject: return ordered_json{{"k", rng() % 2 ? ordered_json(nullptr) : ordered_json::array({1, "x"})}};
    case Kind::kAnyValue: return rng() % 2 ? ordered_json(7) : ordered_json{{"z", false}};
  }
  return nullptr;
}

// Valid under the graph, properties in its order.
bool Valid(const SchemaGraph& g, int32_t id, const ordered_json& v) {
  const SchemaNode& n = g.nodes[static_cast<size_t>(id)];
  if (!n.tag_targets.empty()) {  // the object its first property's value names
    if (!v.is_object() || v.empty() || ordered_json(v.begin().key()).dump() != n.properties[0].key) return false;
    const auto& values = g.nodes[static_cast<size_t>(n.properties[0].node)].literals;
    for (size_t i = 0; i < values.size(); ++i) {
      if (ordered_json::parse(values[i]) == v.begin().value()) return Valid(g, n.tag_targets[i], v);
    }
    return false;
  }
  switch (n.kind) {
    case Kind::kObject: {
      if (!v.is_object()) return false;
      size_t next = 0;  // properties must appear in order
      for (const auto& [key, value] : v.items()) {
        const std::string quoted = ordered_json(key).dump();
        while (next < n.properties.size() && n.properties[next].key != quoted) {
          if (n.properties[next++].required) return false;
        }
        if (next == n.properties.size() || !Valid(g, n.properties[next++].node, value)) return false;
      }
      for (; next < n.properties.size(); ++next) {
        if (n.properties[next].required) return false;
      }
      return true;
    }
    case Kind::kArray: {
      if (!v.is_array() || static_cast<int64_t>(v.size()) < n.min_items) return false;
      if (n.max_items >= 0 && static_cast<int64_t>(v.size()) > n.max_items) return false;
      for (size_t i = 0; i < v.size(); ++i) {
        if (!Valid(g, i < n.prefix_items.size() ? n.prefix_items[i] : n.items, v[i])) return false;
      }
      return true;
    }
    case Kind::kString: return v.is_string();
    case Kind::kNumber: return v.is_number();
    case Kind::kInteger: return v.is_number_integer();
    case Kind::kLiterals:
      for (const std::string& l : n.literals) {
        if (ordered_json::parse(l) == v) return true;
      }
      return false;
    case Kind::kUnion:
      for (int32_t alt : n.alternatives) {
        if (Valid(g, alt, v)) return true;
      }
      return false;
    case Kind::kAnyObject: return v.is_object();
    case Kind::kAnyValue: return true;
  }
  return false;
}

TEST(SchemaAutomatonTest, AgreesWithAValidatorOnRandomInstancesAndMutations) {
  const std::vector<std::string> schemas = {
      kPerson,
      R"({"$defs": {"t": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/t"}, "maxItems": 2}}, "required": ["v"]}}, "$ref": "#/$defs/t"})",
      R"({"type": "array", "items": {"anyOf": [{"type": "string"}, {"enum": [1, 12, null]}, {"type": "object", "properties": {"q": {"type": "boolean"}}}]}, "minItems": 1})",
      // Tuples: pydantic's tuple[int, str, bool], an open one, and draft 7's list form.
      R"({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}, {"type": "boolean"}], "minItems": 3, "maxItems": 3})",
      R"({"type": "array", "prefixItems": [{"enum": ["q", "v"]}, {"type": "integer"}], "items": {"type": "null"}, "minItems": 1})",
      R"({"type": "array", "items": [{"type": "integer"}, {"allOf": [{"type": "string"}], "description": "d"}], "additionalItems": false})",
      kCalls};
  std::mt19937 rng(11);
  const std::string alphabet = "{}[]:,\" \\0123456789.e-truefalsnl\"qv";
  for (const std::string& schema : schemas) {
    const SchemaGraph g = CompileJsonSchema(schema);
    int valid_mutations = 0;
    for (int i = 0; i < 1500; ++i) {
      const ordered_json v = Instance(g, g.root, rng, 0);
      const std::string text = v.dump(rng() % 2 ? -1 : 1);
      ASSERT_TRUE(Valid(g, g.root, v)) << text;
      ASSERT_TRUE(Accepts(g, text)) << schema << "\n" << text;
      const std::string m = testing::Mutated(text, rng, alphabet);
      if (testing::HasHugeExponent(m)) continue;
      bool oracle = false;
      if (!m.empty() && m.back() != ' ' && m.back() != '\n' && ordered_json::accept(m)) {
        const ordered_json parsed = ordered_json::parse(m);
        oracle = Valid(g, g.root, parsed);
      }
      if (oracle) ++valid_mutations;
      if (!oracle) ASSERT_FALSE(Accepts(g, m)) << schema << "\naccepted: " << m;
    }
    EXPECT_GT(valid_mutations, 50) << schema;  // the mutations that stay valid are tested too
  }
}

TEST(SchemaAutomatonTest, MatcherMasksEndOnlyOnAWholeValue) {
  const std::vector<std::string> bytes = {"{\"", "a\":", "1", "", "}", "2}", "\"a\":", " "};
  GuidedVocab vocab(bytes, {3});
  auto m = MakeGuidedMatcher({GuidedSpec::Kind::kJsonSchema, {}, R"({"properties": {"a": {"type": "integer"}}, "required": ["a"]})"}, vocab);
  using testing::Members;
  EXPECT_EQ(Members(m->Allowed()), (std::vector<int32_t>{0, 7})) << "'{' alone is no token here; '}' would skip the required a";
  for (int32_t id : {0, 1, 2}) ASSERT_TRUE(m->Advance(id));
  EXPECT_EQ(Members(m->Allowed()), (std::vector<int32_t>{2, 4, 5, 7}));
  ASSERT_TRUE(m->Advance(5));
  EXPECT_EQ(Members(m->Allowed()), (std::vector<int32_t>{3}));
  EXPECT_THROW(MakeGuidedMatcher({GuidedSpec::Kind::kJsonSchema, {}, R"({"type": "integer", "multipleOf": 3})"}, vocab),
               JsonSchemaError);
}

// ---------------------------------------------------------------------------------------------
// Strings under minLength, maxLength, pattern and format: random texts written a byte at a time
// (each byte the automaton takes equally likely) all validate, and the automaton never stops
// where the text could not end.

const char* kConstrained = R"({"type": "object", "properties": {
  "p": {"type": "number", "minimum": 0, "maximum": 1},
  "t": {"type": "number", "exclusiveMinimum": -2.5, "exclusiveMaximum": 40},
  "name": {"type": "string", "maxLength": 5},
  "code": {"type": "string", "pattern": "^[A-Z]{3}-\\d+$"},
  "day": {"type": "string", "format": "date"},
  "tag": {"type": "string", "minLength": 2},
  "note": {"type": "string", "pattern": "ok", "minLength": 3, "maxLength": 6},
  "at": {"type": "string", "format": "date-time"},
  "age": {"type": "integer", "minimum": 0, "maximum": 120},
  "delta": {"type": "integer", "exclusiveMinimum": -5, "exclusiveMaximum": 5}},
  "required": ["name", "code", "day", "tag", "note", "at", "age", "delta", "p", "t"], "additionalProperties": false})";

size_t CodePoints(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

bool RealDate(const std::string& ymd) {
  const int y = std::stoi(ymd.substr(0, 4)), m = std::stoi(ymd.substr(5, 2)), d = std::stoi(ymd.substr(8, 2));
  if (y < 1 || m < 1 || m > 12 || d < 1) return false;
  const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  const int days[] = {31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return d <= days[m - 1];
}

// A text written one random byte at a time among those the automaton takes; past `soft` bytes
// the bytes that end a string or a container are preferred, so that texts end.
std::string RandomText(const SchemaGraph& g, std::mt19937& rng, size_t soft) {
  SchemaAutomaton a(&g);
  std::string text;
  for (;;) {
    if (a.Accepted()) return text;
    std::vector<uint8_t> taken, ending;
    for (int c = 0; c < 256; ++c) {
      SchemaAutomaton next = a;
      if (!next.Feed(static_cast<uint8_t>(c))) continue;
      taken.push_back(static_cast<uint8_t>(c));
      if (c == '"' || c == '}' || c == ',' || (c >= '0' && c <= '9') || c == ':' || c == 'Z' || c == 'T' || c == '-') {
        ending.push_back(static_cast<uint8_t>(c));
      }
    }
    if (taken.empty()) {
      std::string shown;
      for (char ch : text) {
        const auto b = static_cast<unsigned char>(ch);
        shown += b >= 0x20 && b < 0x7F ? std::string(1, ch) : "\\x" + std::to_string(b);
      }
      ADD_FAILURE() << "stuck after: " << shown;
      return text;
    }
    const std::vector<uint8_t>& from = text.size() > soft && !ending.empty() ? ending : taken;
    const uint8_t c = from[rng() % from.size()];
    EXPECT_TRUE(a.Feed(c));
    text.push_back(static_cast<char>(c));
  }
}

TEST(SchemaAutomatonTest, ConstrainedStringsValidate) {
  const SchemaGraph g = CompileJsonSchema(kConstrained);
  std::mt19937 rng(29);
  const std::regex code("^[A-Z]{3}-\\d+$", std::regex::ECMAScript);
  const std::regex datetime("^\\d{4}-\\d{2}-\\d{2}T([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d{1,6})?(Z|[+-]([01]\\d|2[0-3]):[0-5]\\d)$");
  size_t escapes = 0, non_ascii = 0;
  std::set<int64_t> ages;
  int fractions = 0;
  for (int i = 0; i < 300; ++i) {
    const std::string text = RandomText(g, rng, 60 + rng() % 60);
    if (HasFatalFailure()) return;
    ASSERT_TRUE(nlohmann::json::accept(text)) << text;
    const nlohmann::json v = nlohmann::json::parse(text);
    const auto field = [&](const char* k) { return v.at(k).get<std::string>(); };
    EXPECT_LE(CodePoints(field("name")), 5u) << text;
    EXPECT_TRUE(std::regex_search(field("code"), code)) << text;
    EXPECT_TRUE(std::regex_match(field("day"), std::regex("\\d{4}-\\d{2}-\\d{2}")) && RealDate(field("day"))) << text;
    EXPECT_GE(CodePoints(field("tag")), 2u) << text;
    const std::string note = field("note");
    EXPECT_TRUE(note.find("ok") != std::string::npos && CodePoints(note) >= 3 && CodePoints(note) <= 6) << text;
    EXPECT_TRUE(std::regex_match(field("at"), datetime) && RealDate(field("at").substr(0, 10))) << text;
    const int64_t age = v.at("age").get<int64_t>(), delta = v.at("delta").get<int64_t>();
    EXPECT_TRUE(age >= 0 && age <= 120 && delta > -5 && delta < 5) << text;
    const double p = v.at("p").get<double>(), t = v.at("t").get<double>();
    EXPECT_TRUE(p >= 0 && p <= 1 && t > -2.5 && t < 40) << text;
    fractions += p != 0 && p != 1;
    ages.insert(age);
    escapes += text.find('\\') != std::string::npos;
    for (char c : text) non_ascii += static_cast<unsigned char>(c) >= 0x80;
  }
  EXPECT_GT(escapes, 4u) << "escapes were written and counted as one character";
  EXPECT_GT(non_ascii, 100u) << "and multi-byte characters";
  EXPECT_GT(ages.size(), 50u) << "ages across the range";
  EXPECT_GT(fractions, 20) << "probabilities with fractions";
  // \u escapes are never taken where characters are counted (a surrogate pair is one).
  const auto takes = [&](const std::string& text) {
    SchemaAutomaton a(&g);
    for (char c : text) {
      if (!a.Feed(static_cast<uint8_t>(c))) return false;
    }
    return true;
  };
  EXPECT_TRUE(takes("{\"p\":0,\"t\":1,\"name\":\"\\n\\\"\\\\\xC3\xA9x\"")) << "short escapes and a two-byte character count one each: five characters";
  EXPECT_FALSE(takes("{\"p\":0,\"t\":1,\"name\":\"\\n\\\"\\\\\xC3\xA9xy")) << "the sixth character";
  EXPECT_FALSE(takes(R"({"p":0,"t":1,"name":"\u0041)"));
  EXPECT_TRUE(takes(R"({"p":0,"t":1,"name":"abcde")"));
  EXPECT_FALSE(takes(R"({"p":0,"t":1,"name":"abcdef)")) << "six characters";
  EXPECT_TRUE(takes(R"({"p":0,"t":1,"name":"","code":"ABC-1","day":"2024-02-29")"));
  EXPECT_FALSE(takes(R"({"p":0,"t":1,"name":"","code":"ABC-1","day":"2023-02-29)")) << "no such day";
}

}  // namespace
}  // namespace ferry::worker
