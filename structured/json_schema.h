// JSON Schema compiled for guided decoding: a graph of the value shapes a text may take, which
// the worker's byte automaton walks (worker/engine/guided_schema.h) and which the gateway and
// scheduler compile too, to refuse a schema before it reaches a step.
//
// What is generated is always valid under the schema; what cannot be guaranteed is refused with
// a message naming the place (a JSON pointer) and the keyword, never ignored. Supported:
// - type (a name or a list), enum, const, anyOf / oneOf whose alternatives differ in their first
//   byte (so the first byte decides which one is taken: string vs number vs null, say) or are
//   objects told apart by a first property that each requires with its own string values (a
//   tagged union, as pydantic's discriminated unions and tool calls: {"name": "f", ...});
// - objects: properties (generated in the schema's order, as OpenAI's structured outputs),
//   required, additionalProperties false, true or absent (only listed properties are generated
//   when there are some; none listed and not false: any object);
// - strings: minLength, maxLength (characters, as JSON Schema counts code points), pattern
//   (ECMA-262 search semantics, the syntax of structured/regex_dfa.h) and format (date, time,
//   date-time, email, uuid, ipv4, uri: structured/json_string_dfa.h); a pattern or format becomes one
//   DFA over the string's JSON text, lengths beside them included;
// - numbers and integers: minimum, maximum, exclusiveMinimum, exclusiveMaximum (numbers, or
//   draft 4's booleans), as a DFA of the range's texts (a bounded number is written as a plain
//   decimal of at most 9 + 6 digits: structured/json_number_range.h);
// - arrays: items (one schema), minItems, maxItems, tuples (prefixItems, or a list under items
//   with additionalItems);
// - allOf of one schema (pydantic's wrapper of a described $ref);
// - $ref to "#", "#/$defs/NAME" or "#/definitions/NAME", recursive ones included;
// - annotations (title, description, default, examples, $schema, $id, $comment, ...) are ignored.
// Refused: number and object assertions the automaton cannot keep (multipleOf, other formats,
// format on a number, bounds of more than 15 significant digits,
// minProperties, maxProperties, patternProperties, propertyNames, uniqueItems, contains,
// allOf of several schemas, not, if / then / else, dependent*, unevaluated*), a schema-valued
// additionalProperties, and anyOf alternatives that can start with the same byte.
#pragma once

#include <bitset>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "structured/regex_dfa.h"

namespace ferry {

// The schema could not be compiled; what() names the place and the keyword.
class JsonSchemaError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct SchemaNode {
  enum class Kind : uint8_t {
    kAnyValue,   // any JSON value
    kAnyObject,  // any JSON object
    kObject,     // the listed properties, in order
    kArray,      // items of one node
    kString,     // any string
    kNumber,     // any number
    kInteger,    // a number without fraction or exponent
    kLiterals,   // exactly one of a few JSON texts (enum, const, boolean, null)
    kUnion,      // one of alternatives that differ in their first byte
  };
  struct Property {
    std::string key;  // the key as written: a JSON string, quotes included
    int32_t node = 0;
    bool required = false;
  };
  Kind kind = Kind::kAnyValue;
  std::vector<Property> properties;   // kObject, schema order
  int32_t items = -1;                 // kArray: the items' node (past prefix_items)
  std::vector<int32_t> prefix_items;  // kArray: item i's node, for the first ones (a tuple)
  int64_t min_items = 0;              // kArray
  int64_t max_items = -1;             // kArray; -1: no limit
  std::vector<std::string> literals;  // kLiterals: compact JSON texts
  std::vector<int32_t> alternatives;  // kUnion
  // kObject standing for a union's objects told apart by their first property, the tag (required,
  // the same key in each, a string const or enum whose values no two share): `properties` holds
  // the tag alone, its node a kLiterals of every value, and the value literals[i] selects the
  // object tag_targets[i], whose properties follow the tag.
  std::vector<int32_t> tag_targets;
  // kString: characters allowed (max -1: no limit), and the index in SchemaGraph::dfas
  // of the DFA over its JSON text when a pattern or format constrains it (-1: none). With a DFA
  // the lengths are in it: max_length is what it was built with (possibly lowered, see
  // JsonStringDfa), informational. kInteger, kNumber: the DFA of its range's texts, when bounded
  // (structured/json_number_range.h).
  int64_t min_length = 0;
  int64_t max_length = -1;
  int32_t dfa = -1;
  std::bitset<256> first_bytes;       // bytes a value of this node can start with
};

struct SchemaGraph {
  std::vector<SchemaNode> nodes;
  int32_t root = 0;
  std::vector<std::shared_ptr<const RegexDfa>> dfas;
};

// Limits that keep a schema's automaton small; a schema past one is refused naming it.
inline constexpr size_t kMaxSchemaNodes = 1024;
inline constexpr size_t kMaxSchemaProperties = 64;  // per object
inline constexpr size_t kMaxSchemaLiterals = 64;    // per enum
inline constexpr size_t kMaxSchemaLiteralBytes = 1024;

// Compiles a JSON Schema given as JSON text. Throws JsonSchemaError.
SchemaGraph CompileJsonSchema(const std::string& schema_json);

// CompileJsonSchema through a process-wide cache of the last few schemas (structured/compile_cache.h).
std::shared_ptr<const SchemaGraph> CompileJsonSchemaCached(const std::string& schema_json);

}  // namespace ferry
