#include "common/json_schema.h"

#include <gtest/gtest.h>

#include <string>

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
      {R"({"type": "object", "properties": {"name": {"type": "string", "minLength": 3}}})",
       {"/properties/name", "\"minLength\" is not supported"}},
      {R"({"type": "integer", "maximum": 5})", {"schema at /:", "\"maximum\""}},
      {R"({"type": "string", "pattern": "^a$"})", {"\"pattern\""}},
      {R"({"anyOf": [{"type": "object"}, {"type": "object", "properties": {"a": {}}}]})", {"\"anyOf\" alternatives must differ"}},
      {R"({"anyOf": [{"enum": ["a"]}, {"type": "string"}]})", {"\"anyOf\""}},
      {R"({"$ref": "#/$defs/missing"})", {"\"#/$defs/missing\""}},
      {R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})", {"refers to itself"}},
      {R"({"$ref": "#/$defs/a", "type": "string", "$defs": {"a": {}}})", {"\"type\" beside \"$ref\""}},
      {"false", {"accepts no value"}},
      {R"({"type": "object", "additionalProperties": {"type": "string"}})", {"additionalProperties"}},
      {R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})", {"required property \"b\""}},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", {"\"maxItems\" is below \"minItems\""}},
      {R"({"type": "array", "items": [{"type": "string"}]})", {"tuples"}},
      {R"({"type": "strin"})", {"\"strin\" is not a JSON Schema type"}},
      {R"({"type": "string", "enum": ["a", 1]})", {"the value 1 is not of the schema's \"type\""}},
      {R"({"enum": []})", {"non-empty"}},
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

}  // namespace
}  // namespace ferry
