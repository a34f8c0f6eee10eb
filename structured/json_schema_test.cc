#include "structured/json_schema.h"

#include <gtest/gtest.h>

#include <random>
#include <regex>
#include <string>
#include <tuple>

#include "structured/json_number_range.h"
#include "structured/json_string_dfa.h"

namespace ferry {
namespace {

using Kind = SchemaNode::Kind;

const SchemaNode& Root(const SchemaGraph& g) { return g.nodes[static_cast<size_t>(g.root)]; }
const SchemaNode& Node(const SchemaGraph& g, int32_t id) { return g.nodes[static_cast<size_t>(id)]; }

// The compiler's message for a schema it must refuse.
std::string Refusal(const std::string& schema) {
  try {
    CompileJsonSchema(schema);
  } catch (const JsonSchemaError& e) {
    return e.what();
  }
  ADD_FAILURE() << "compiled: " << schema;
  return {};
}

TEST(JsonSchemaTest, CompilesAnObjectWithPropertiesInTheSchemasOrder) {
  const SchemaGraph g = CompileJsonSchema(R"({
    "type": "object", "title": "Person", "additionalProperties": false,
    "properties": {
      "name": {"type": "string", "description": "annotations are ignored"},
      "age": {"type": "integer"},
      "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
      "status": {"enum": ["active", "gone", 3]},
      "score": {"type": ["number", "null"]}
    },
    "required": ["name", "status"]})");
  const SchemaNode& root = Root(g);
  ASSERT_EQ(root.kind, Kind::kObject);
  ASSERT_EQ(root.properties.size(), 5u);
  const std::vector<std::string> keys = {"\"name\"", "\"age\"", "\"tags\"", "\"status\"", "\"score\""};
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(root.properties[i].key, keys[i]) << "schema order, quoted";
  EXPECT_TRUE(root.properties[0].required);
  EXPECT_FALSE(root.properties[1].required);
  EXPECT_EQ(Node(g, root.properties[1].node).kind, Kind::kInteger);
  const SchemaNode& tags = Node(g, root.properties[2].node);
  EXPECT_EQ(tags.kind, Kind::kArray);
  EXPECT_EQ(tags.min_items, 1);
  EXPECT_EQ(tags.max_items, 3);
  EXPECT_EQ(Node(g, tags.items).kind, Kind::kString);
  const SchemaNode& status = Node(g, root.properties[3].node);
  EXPECT_EQ(status.literals, (std::vector<std::string>{"\"active\"", "\"gone\"", "3"}));
  const SchemaNode& score = Node(g, root.properties[4].node);
  ASSERT_EQ(score.kind, Kind::kUnion);
  EXPECT_TRUE(score.first_bytes['n'] && score.first_bytes['-'] && score.first_bytes['7']);
  EXPECT_TRUE(root.first_bytes['{'] && !root.first_bytes['[']);
}

TEST(JsonSchemaTest, ShapesWithoutATypeAndBooleanSchemas) {
  EXPECT_EQ(Root(CompileJsonSchema("{}")).kind, Kind::kAnyValue);
  EXPECT_EQ(Root(CompileJsonSchema("true")).kind, Kind::kAnyValue);
  EXPECT_EQ(Root(CompileJsonSchema(R"({"type": "object"})")).kind, Kind::kAnyObject);
  EXPECT_EQ(Root(CompileJsonSchema(R"({"type": "object", "additionalProperties": false})")).kind, Kind::kObject);
  EXPECT_EQ(Root(CompileJsonSchema(R"({"properties": {"a": {}}})")).kind, Kind::kObject);
  EXPECT_EQ(Root(CompileJsonSchema(R"({"items": {"type": "boolean"}})")).kind, Kind::kArray);
  EXPECT_EQ(Root(CompileJsonSchema(R"({"type": "boolean"})")).literals, (std::vector<std::string>{"false", "true"}));
  EXPECT_EQ(Root(CompileJsonSchema(R"({"const": {"a": [1, null]}})")).literals, (std::vector<std::string>{R"({"a":[1,null]})"}));
  EXPECT_EQ(Root(CompileJsonSchema(R"({"type": ["integer", "number"]})")).kind, Kind::kNumber) << "number absorbs integer";
}

TEST(JsonSchemaTest, RefsResolveRecursively) {
  const SchemaGraph g = CompileJsonSchema(R"({
    "$defs": {"node": {"type": "object", "properties": {
      "value": {"type": "integer"},
      "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["value"]}},
    "$ref": "#/$defs/node"})");
  const SchemaNode& root = Root(g);
  ASSERT_EQ(root.kind, Kind::kObject);
  const SchemaNode& children = Node(g, root.properties[1].node);
  ASSERT_EQ(children.kind, Kind::kArray);
  const SchemaNode& item = Node(g, children.items);
  EXPECT_EQ(item.kind, Kind::kObject);
  EXPECT_EQ(Node(g, item.properties[1].node).kind, Kind::kArray) << "the reference leads back to the same shape";
  EXPECT_EQ(Root(CompileJsonSchema(R"({"type": "array", "items": {"$ref": "#"}, "maxItems": 2})")).kind, Kind::kArray);
  // JSON pointer escapes, ~1 before ~0 (RFC 6901): "a~01b" names "a~1b".
  EXPECT_EQ(Root(CompileJsonSchema(R"({"definitions": {"a~1b": {"type": "string"}}, "$ref": "#/definitions/a~01b"})")).kind,
            Kind::kString);
}

TEST(JsonSchemaTest, RefusesWhatItCannotGuaranteeNamingThePlaceAndKeyword) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {R"({"type": "object", "properties": {"name": {"type": "string", "minLength": -3}}})",
       {"/properties/name", "\"minLength\" must be a non-negative integer"}},
      {R"({"type": "string", "minLength": 3, "maxLength": 2})", {"\"maxLength\" is below \"minLength\""}},
      {R"({"type": "number", "maximum": 0.1234567890123456})", {"schema at /:", "has more than 15 significant digits"}},
      {R"({"type": "number", "minimum": 1e12})", {"no number between the bounds can be written"}},
      {R"({"type": "number", "minimum": 1, "exclusiveMaximum": 1})", {"no number between the bounds"}},
      {R"({"type": "integer", "minimum": 5, "exclusiveMaximum": 5})", {"no integer lies between"}},
      {R"({"type": "integer", "maximum": 1e30})", {"past the 64-bit integers"}},
      {R"({"type": "string", "pattern": "(a)\\1"})", {"\"pattern\": regex at byte", "backreferences"}},
      {R"({"type": "string", "format": "ipv6"})", {"\"format\" \"ipv6\" is not supported (served: date"}},
      {R"({"type": "integer", "format": "int32"})", {"\"format\" on a integer is not supported"}},
      {R"({"enum": ["a", "bb"], "minLength": 2})", {"\"minLength\" beside \"enum\""}},
      {R"({"type": "string", "pattern": "^a{3}$", "maxLength": 2})", {"\"pattern\": no string satisfies"}},
      {R"({"type": "string", "format": "uuid", "minLength": 1001})", {"minLength 1001 beside a pattern or format"}},
      {R"({"anyOf": [{"type": "object"}, {"type": "object", "properties": {"a": {}}}]})", {"\"anyOf\" alternatives must differ"}},
      {R"({"anyOf": [{"enum": ["a"]}, {"type": "string"}]})", {"\"anyOf\""}},
      {R"({"$ref": "#/$defs/missing"})", {"\"#/$defs/missing\""}},
      {R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})", {"refers to itself"}},
      {R"({"$ref": "#/$defs/a", "type": "string", "$defs": {"a": {}}})", {"\"type\" beside \"$ref\""}},
      {"false", {"accepts no value"}},
      {R"({"type": "object", "additionalProperties": {"type": "string"}})", {"additionalProperties"}},
      {R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})", {"required property \"b\""}},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", {"\"maxItems\" is below \"minItems\""}},
      {R"({"type": "strin"})", {"\"strin\" is not a JSON Schema type"}},
      {R"({"type": "string", "enum": ["a", 1]})", {"the value 1 is not of the schema's \"type\""}},
      {R"({"enum": []})", {"non-empty"}},
      {R"({"allOf": [{"type": "string"}, {"maxLength": 3}]})", {"\"allOf\" of other than one schema"}},
      {R"({"type": "array", "prefixItems": [{}], "items": false, "minItems": 2})", {"\"minItems\" is above the 1 items allowed"}},
      {"{\"type\": ", {"not JSON"}},
      {"[1]", {"an object or a boolean"}},
  };
  for (const auto& [schema, needles] : cases) {
    const std::string message = Refusal(schema);
    for (const std::string& needle : needles) EXPECT_NE(message.find(needle), std::string::npos) << schema << "\n" << message;
  }
  std::string many = R"({"enum": [)";
  for (size_t i = 0; i <= kMaxSchemaLiterals; ++i) many += (i ? "," : "") + std::to_string(i);
  EXPECT_NE(Refusal(many + "]}").find("over the limit of 64"), std::string::npos);
  std::string wide = R"({"type": "object", "properties": {)";
  for (size_t i = 0; i <= kMaxSchemaProperties; ++i) wide += (i ? "," : "") + std::string("\"p") + std::to_string(i) + "\": {}";
  EXPECT_NE(Refusal(wide + "}}").find("65 properties"), std::string::npos);
}

// A string's pattern, format and lengths as one DFA over its JSON text (json_string_dfa.h):
// exactly the contents std::regex (ECMAScript, JSON Schema's dialect) finds the pattern in, of
// the right length, written with JSON's short escapes.
std::string Encoded(const std::string& content) {
  std::string out;
  for (char c : content) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default: out += c;
    }
  }
  return out;
}

size_t CodePoints(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

TEST(JsonStringDfaTest, TakesExactlyTheContentsThatValidate) {
  struct Case {
    std::string pattern;
    int64_t min, max;
  };
  const std::vector<Case> cases = {{"^[a-c]+-\\d$", 0, -1}, {"b\"", 2, 5}, {"^\\\\?x", 0, 4}, {"(a|c)$", 1, -1},
                                   {"[\\n\\t]", 0, 3}, {"^a\\$", 0, -1}};
  const std::string alphabet = "abcx-1$\"\\\n\t\xC3\xA9";
  for (const Case& c : cases) {
    const RegexDfa dfa = JsonStringDfa({PatternContentRegex(c.pattern)}, c.min, c.max, nullptr);
    const std::regex oracle(c.pattern, std::regex::ECMAScript);
    std::vector<std::string> texts = {""};
    int accepted = 0;
    for (int len = 0; len <= 4; ++len) {
      std::vector<std::string> longer;
      for (const std::string& t : texts) {
        const size_t chars = CodePoints(t);
        bool valid_utf8 = true;  // the alphabet's only multi-byte character is C3 A9
        for (size_t i = 0; i < t.size(); ++i) {
          const auto b = static_cast<unsigned char>(t[i]);
          if (b == 0xC3 && (i + 1 == t.size() || static_cast<unsigned char>(t[i + 1]) != 0xA9)) valid_utf8 = false;
          if (b == 0xA9 && (i == 0 || static_cast<unsigned char>(t[i - 1]) != 0xC3)) valid_utf8 = false;
        }
        const bool want = valid_utf8 && std::regex_search(t, oracle) && static_cast<int64_t>(chars) >= c.min &&
                          (c.max < 0 || static_cast<int64_t>(chars) <= c.max);
        ASSERT_EQ(dfa.Matches(Encoded(t)), want) << c.pattern << " '" << t << "'";
        accepted += want;
        if (len < 4) {
          for (char a : alphabet) longer.push_back(t + a);
        }
      }
      texts = std::move(longer);
    }
    EXPECT_GE(accepted, 3) << c.pattern;
    EXPECT_FALSE(dfa.Matches("\\u0061")) << "no \\u escapes";
  }
}

// Formats, each against texts that are and are not of it.
TEST(JsonStringDfaTest, FormatsTakeTheirTextsOnly) {
  const std::vector<std::tuple<std::string, std::vector<std::string>, std::vector<std::string>>> cases = {
      {"date", {"2024-02-29", "2000-02-29", "0001-01-31", "1999-12-31", "2023-04-30"},
       {"2023-02-29", "1900-02-29", "2023-04-31", "0000-01-01", "2023-13-01", "2023-1-01", "20230101"}},
      {"time", {"23:59:59Z", "00:00:00.123456+05:30", "12:30:00-23:59"}, {"24:00:00Z", "12:60:00Z", "12:00:60Z", "12:00:00", "12:00:00.1234567Z"}},
      {"date-time", {"2024-02-29T12:00:00Z"}, {"2024-02-29 12:00:00Z", "2024-02-30T12:00:00Z"}},
      {"email", {"a.b+c@example.com", "x@a-b.io"}, {"a..b@example.com", "@example.com", "a@example", "a@-x.com"}},
      {"uuid", {"123e4567-e89b-12d3-a456-426614174000"}, {"123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g"}},
      {"ipv4", {"192.168.0.1", "0.0.0.0", "255.255.255.255"}, {"256.1.1.1", "01.2.3.4", "1.2.3"}},
      {"uri", {"https://example.com", "http://a.b/c%20d?x=1&y=/#frag"}, {"ftp://x.com", "https://", "https://a.com:80", "https://a.com/%zz"}},
  };
  for (const auto& [format, good, bad] : cases) {
    const RegexDfa dfa = JsonStringDfa({*FormatContentRegex(format)}, 0, -1, nullptr);
    for (const std::string& t : good) EXPECT_TRUE(dfa.Matches(t)) << format << ": " << t;
    for (const std::string& t : bad) EXPECT_FALSE(dfa.Matches(t)) << format << ": " << t;
  }
  EXPECT_FALSE(FormatContentRegex("ipv6").has_value());
}

// A maxLength too large to combine with a format is lowered to what fits; the strings still
// validate, and a minLength is kept.
TEST(JsonStringDfaTest, LowersAMaxLengthThatDoesNotFitAndKeepsTheMinimum) {
  int64_t used = 0;
  const RegexDfa dfa = JsonStringDfa({*FormatContentRegex("uri")}, 1, 2083, &used);
  EXPECT_GE(used, 100);
  EXPECT_LT(used, 2083);
  EXPECT_LE(dfa.num_states(), static_cast<int32_t>(kMaxRegexDfaStates) * 2);
  EXPECT_TRUE(dfa.Matches("https://example.com/" + std::string(static_cast<size_t>(used) - 20, 'a')));
  EXPECT_FALSE(dfa.Matches("https://example.com/" + std::string(static_cast<size_t>(used) - 19, 'a')));
  const SchemaGraph g = CompileJsonSchema(R"({"type": "string", "format": "uri", "minLength": 1, "maxLength": 2083})");
  EXPECT_EQ(g.nodes[static_cast<size_t>(g.root)].max_length, used);
  EXPECT_EQ(g.dfas.size(), 1u);
}

// Integer ranges as DFAs of their texts: exactly the integers in range, in JSON's one spelling.
TEST(IntegerRangeTest, TakesExactlyTheIntegersInRange) {
  std::mt19937 rng(5);
  auto check = [](std::optional<int64_t> lo, std::optional<int64_t> hi) {
    const RegexDfa dfa = CompileRegex(IntegerRangeRegex(lo, hi));
    for (int64_t v = -1200; v <= 1200; ++v) {
      const bool in = (!lo || v >= *lo) && (!hi || v <= *hi);
      ASSERT_EQ(dfa.Matches(std::to_string(v)), in) << (lo ? *lo : -999999) << ".." << (hi ? *hi : 999999) << ": " << v;
    }
    for (const char* bad : {"-0", "01", "+1", "", "-", "00", "1.0", "1e2"}) {
      ASSERT_FALSE(dfa.Matches(bad)) << bad;
    }
  };
  for (int i = 0; i < 150; ++i) {
    int64_t a = static_cast<int64_t>(rng() % 2001) - 1000, b = static_cast<int64_t>(rng() % 2001) - 1000;
    if (a > b) std::swap(a, b);
    const unsigned open = rng() % 6;
    check(open == 1 ? std::nullopt : std::optional<int64_t>(a), open == 2 ? std::nullopt : std::optional<int64_t>(b));
    if (HasFatalFailure()) return;
  }
  check(0, 0);
  check(std::nullopt, std::nullopt);
  check(-9, 99);
  check(100, 999);
  const RegexDfa big = CompileRegex(IntegerRangeRegex(INT64_MIN, INT64_MAX - 1));
  EXPECT_TRUE(big.Matches("9223372036854775806"));
  EXPECT_FALSE(big.Matches("9223372036854775807"));
  EXPECT_TRUE(big.Matches("-9223372036854775808"));
  EXPECT_FALSE(big.Matches("-9223372036854775809"));
}

// Schema bounds narrowed to whole numbers: exclusive ones, draft 4's booleans, fractional ones.
TEST(IntegerRangeTest, SchemaBoundsNarrowToWholeNumbers) {
  const std::vector<std::tuple<std::string, int64_t, int64_t>> cases = {
      {R"({"type": "integer", "minimum": 1, "maximum": 5})", 1, 5},
      {R"({"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 5})", 2, 4},
      {R"({"type": "integer", "minimum": 1, "exclusiveMinimum": true, "maximum": 5, "exclusiveMaximum": true})", 2, 4},
      {R"({"type": "integer", "minimum": 0.5, "maximum": 4.5})", 1, 4},
      {R"({"type": "integer", "exclusiveMinimum": 0.5, "exclusiveMaximum": 4.5})", 1, 4},
  };
  for (const auto& [schema, lo, hi] : cases) {
    const SchemaGraph g = CompileJsonSchema(schema);
    const SchemaNode& n = g.nodes[static_cast<size_t>(g.root)];
    ASSERT_EQ(n.kind, Kind::kInteger) << schema;
    ASSERT_GE(n.dfa, 0) << schema;
    const RegexDfa& dfa = *g.dfas[static_cast<size_t>(n.dfa)];
    for (int64_t v = -10; v <= 10; ++v) EXPECT_EQ(dfa.Matches(std::to_string(v)), v >= lo && v <= hi) << schema << ": " << v;
    EXPECT_FALSE(n.first_bytes['+']);
  }
  const SchemaGraph positive = CompileJsonSchema(R"({"type": "integer", "minimum": 1})");
  EXPECT_FALSE(positive.nodes[static_cast<size_t>(positive.root)].first_bytes['-']) << "first bytes follow the range";
  EXPECT_FALSE(positive.nodes[static_cast<size_t>(positive.root)].first_bytes['0']);
}

// Bounded numbers as plain decimals: exactly the texts (at most 9 + 6 digits, no exponent, no -0)
// whose value is in range, compared as a validator compares them (as doubles).
TEST(NumberRangeTest, TakesExactlyTheDecimalsInRange) {
  // Integers near 0 and around the bounds' magnitudes; every fraction of up to two digits and
  // three-digit ones next to the bounds' own.
  std::vector<int> integers;
  for (int i = -20; i <= 20; ++i) integers.push_back(i);
  for (int i : {99, 100, 101, 149, 150, 151}) integers.push_back(i), integers.push_back(-i);
  std::vector<std::string> fractions = {""};
  for (int f = 0; f < 100; ++f) {
    if (f < 10) fractions.push_back("." + std::to_string(f));
    fractions.push_back(std::string(".") + (f < 10 ? "0" : "") + std::to_string(f));
  }
  for (const char* f : {".000", ".001", ".009", ".010", ".124", ".125", ".126", ".250", ".500", ".999", ".0011", ".000001"}) {
    fractions.push_back(f);
  }
  std::vector<std::string> texts;
  for (int i : integers) {
    for (const std::string& f : fractions) texts.push_back((i < 0 ? "-" : "") + std::to_string(std::abs(i)) + f);
  }
  for (int f = 1; f < 10; ++f) texts.push_back("-0." + std::to_string(f));  // negative fractions of zero
  const std::vector<std::string> bounds = {"0", "1", "0.5", "-2.25", "10", "1e-2", "-0.001", "100", "-150", "0.125"};
  int ranges = 0;
  for (size_t a = 0; a < bounds.size(); ++a) {
    for (size_t b = 0; b < bounds.size(); ++b) {
      for (int mode = 0; mode < 4; ++mode) {
        const double lo = std::stod(bounds[a]), hi = std::stod(bounds[b]);
        const bool lo_open = mode & 1, hi_open = mode & 2;
        if (lo > hi || (lo == hi && (lo_open || hi_open))) continue;
        const bool lower_only = a == b && mode == 0;  // one bound alone, each side
        std::optional<NumberBound> l = NumberBound{bounds[a], lo_open}, h = NumberBound{bounds[b], hi_open};
        if (lower_only && (a % 2 == 0)) h.reset();
        if (lower_only && (a % 2 == 1)) l.reset();
        const RegexDfa dfa = NumberRangeDfa(l, h);
        ++ranges;
        for (const std::string& t : texts) {
          const double v = std::stod(t);
          const bool negative_zero = t[0] == '-' && v == 0;
          const bool want = !negative_zero && (!l || (lo_open ? v > lo : v >= lo)) && (!h || (hi_open ? v < hi : v <= hi));
          ASSERT_EQ(dfa.Matches(t), want) << (l ? l->text : "-inf") << (lo_open ? " < " : " <= ") << t
                                          << (hi_open ? " < " : " <= ") << (h ? h->text : "inf");
        }
        for (const char* bad : {"01", "-0", "1.", ".5", "1e2", "+1", "-0.0", "0.1234567", "1234567890"}) {
          ASSERT_FALSE(dfa.Matches(bad)) << bad;
        }
      }
    }
  }
  EXPECT_GE(ranges, 150);
}

TEST(NumberRangeTest, SchemaBoundsPickTheTighterOne) {
  const std::vector<std::tuple<std::string, std::vector<std::string>, std::vector<std::string>>> cases = {
      {R"({"type": "number", "minimum": 0, "maximum": 1})", {"0", "0.5", "1", "0.999999"}, {"-0.1", "1.000001", "2"}},
      {R"({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1})", {"0.000001", "0.5"}, {"0", "1", "0.0"}},
      {R"({"type": "number", "minimum": 0, "exclusiveMinimum": true})", {"0.1", "5"}, {"0", "-1"}},
      {R"({"type": "number", "minimum": 1, "exclusiveMinimum": 2})", {"2.5"}, {"2", "1.5"}},
      {R"({"minimum": -0.5, "maximum": 0.25})", {"-0.5", "0", "0.25"}, {"-0.6", "0.3"}},
      {R"({"type": "number", "maximum": 1e-2})", {"0.01", "-5", "0.009"}, {"0.011"}},
  };
  for (const auto& [schema, good, bad] : cases) {
    const SchemaGraph g = CompileJsonSchema(schema);
    const SchemaNode& n = g.nodes[static_cast<size_t>(g.root)];
    ASSERT_EQ(n.kind, Kind::kNumber) << schema;
    ASSERT_GE(n.dfa, 0) << schema;
    const RegexDfa& dfa = *g.dfas[static_cast<size_t>(n.dfa)];
    for (const std::string& t : good) EXPECT_TRUE(dfa.Matches(t)) << schema << ": " << t;
    for (const std::string& t : bad) EXPECT_FALSE(dfa.Matches(t)) << schema << ": " << t;
  }
}

}  // namespace
}  // namespace ferry
