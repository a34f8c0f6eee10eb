#include "gateway/http/guided_format.h"

#include <algorithm>

#include <fmt/format.h>

#include "structured/ebnf_grammar.h"
#include "structured/json_schema.h"
#include "structured/regex_dfa.h"
#include "gateway/request_validation.h"  // the gateway's limits

namespace ferry::gateway::http {
namespace {

using nlohmann::ordered_json;
using Error = std::optional<ApiError>;

// One structured output constraint and the request field that asked for it. A schema given as
// JSON (not as text) stays where it lies until it is the one constraint (FinishJsonSchema).
struct GuidedAsk {
  std::string field;
  ferry::v1::GuidedDecoding guided;
  const json* schema = nullptr;  // a schema given as JSON, at `where` in the body
  std::string where;             // a schema's place, dotted: "response_format.json_schema.schema"
};

GuidedAsk JsonObjectAsk(std::string field) {
  GuidedAsk ask{std::move(field), {}};
  ask.guided.set_json_object(true);
  return ask;
}

// A list of strings: exactly one of them (its limits are the gateway's, request_validation.h).
Error ParseChoices(const json& v, const std::string& field, std::vector<GuidedAsk>& asks) {
  if (!v.is_array()) return WrongType(field, v, "a list of strings");
  if (v.empty()) return std::nullopt;  // asks for nothing, as the other fields' empty values
  GuidedAsk ask{field, {}};
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) return WrongType(fmt::format("{}[{}]", field, i), v[i], "a string");
    ask.guided.mutable_choice()->add_choices(v[i].get<std::string>());
  }
  asks.push_back(std::move(ask));
  return std::nullopt;
}

// vLLM's guided_json and structured_outputs.json: a schema as an object, or as a string holding
// its JSON text (sent on as written). {} asks for nothing, as the other fields' empty values.
Error ParseVllmSchema(const json& v, const std::string& field, std::vector<GuidedAsk>& asks) {
  if (!v.is_object() && !v.is_string()) return WrongType(field, v, "a JSON schema (an object, or a string of one)");
  if (v.is_object() && v.empty()) return std::nullopt;
  GuidedAsk ask{field, {}, nullptr, field};
  if (v.is_string()) {
    ask.guided.set_json_schema(v.get<std::string>());
  } else {
    ask.schema = &v;
  }
  asks.push_back(std::move(ask));
  return std::nullopt;
}

// vLLM's guided_regex and structured_outputs.regex: a pattern the whole text matches (Python re's
// subset in structured/regex_dfa.h), compiled by FinishRegex once it is the one constraint.
Error ParseRegex(const json& v, const std::string& field, std::vector<GuidedAsk>& asks) {
  if (!v.is_string()) return WrongType(field, v, "a string (a regular expression)");
  GuidedAsk ask{field, {}};
  ask.guided.set_regex(v.get<std::string>());
  asks.push_back(std::move(ask));
  return std::nullopt;
}

// vLLM's guided_grammar and structured_outputs.grammar: EBNF / GBNF rules from `root`, served
// when regular (structured/ebnf_grammar.h), checked by FinishGrammar once it is the one constraint.
Error ParseGrammar(const json& v, const std::string& field, std::vector<GuidedAsk>& asks) {
  if (!v.is_string()) return WrongType(field, v, "a string (an EBNF grammar)");
  GuidedAsk ask{field, {}};
  ask.guided.set_grammar(v.get<std::string>());
  asks.push_back(std::move(ask));
  return std::nullopt;
}

// OpenAI's {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}.
// The schema is kept whether strict or not; name and description only describe it.
Error ParseResponseJsonSchema(const json& format, std::vector<GuidedAsk>& asks) {
  const auto spec = format.find("json_schema");
  if (spec == format.end()) {
    return InvalidField("response_format.json_schema", "response_format.json_schema is required with type "
                                                       "\"json_schema\" (an object with a \"schema\")");
  }
  if (!spec->is_object()) return WrongType("response_format.json_schema", *spec, "an object with a \"schema\"");
  const auto schema = spec->find("schema");
  if (schema == spec->end()) {
    return InvalidField("response_format.json_schema.schema", "response_format.json_schema.schema is required "
                                                              "(a JSON schema: an object or a boolean)");
  }
  if (!schema->is_object() && !schema->is_boolean()) {
    return WrongType("response_format.json_schema.schema", *schema, "a JSON schema (an object or a boolean)");
  }
  const auto strict = spec->find("strict");
  if (strict != spec->end() && !strict->is_null() && !strict->is_boolean()) {
    return WrongType("response_format.json_schema.strict", *strict, "a boolean");
  }
  asks.push_back({"response_format", {}, &*schema, "response_format.json_schema.schema"});
  return std::nullopt;
}

// OpenAI's response_format: "text" is the default, "json_object" any JSON object, "json_schema"
// a value valid under the schema.
Error ParseResponseFormat(const json& body, std::vector<GuidedAsk>& asks) {
  if (!Asks(body, "response_format")) return std::nullopt;
  const json& format = body["response_format"];
  const json type = format.is_object() && format.contains("type") ? format["type"] : json();
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    asks.push_back(JsonObjectAsk("response_format"));
    return std::nullopt;
  }
  if (type == "json_schema") return ParseResponseJsonSchema(format, asks);
  return InvalidField("response_format",
                      fmt::format("response_format = {} is not supported (only the types \"text\", \"json_object\" "
                                  "and \"json_schema\" are)", Brief(format)));
}

// vLLM's structured_outputs: choice, json_object, json and regex are served; its other keys
// (grammar, structural_tag, ...) would change the output and are refused. Null values are unset.
Error ParseStructuredOutputs(const json& body, std::vector<GuidedAsk>& asks) {
  if (!Asks(body, "structured_outputs")) return std::nullopt;
  const json& outputs = body["structured_outputs"];
  if (!outputs.is_object()) return WrongType("structured_outputs", outputs, "an object");
  for (const auto& [key, value] : outputs.items()) {
    if (value.is_null()) continue;
    if (key == "choice") {
      if (Error e = ParseChoices(value, "structured_outputs.choice", asks)) return e;
    } else if (key == "json_object") {
      if (!value.is_boolean()) return WrongType("structured_outputs.json_object", value, "a boolean");
      if (value.get<bool>()) asks.push_back(JsonObjectAsk("structured_outputs.json_object"));
    } else if (key == "json") {
      if (Error e = ParseVllmSchema(value, "structured_outputs.json", asks)) return e;
    } else if (key == "regex") {
      if (Error e = ParseRegex(value, "structured_outputs.regex", asks)) return e;
    } else if (key == "grammar") {
      if (Error e = ParseGrammar(value, "structured_outputs.grammar", asks)) return e;
    } else {
      return InvalidField("structured_outputs",
                          fmt::format("structured_outputs key {} is not supported (only \"choice\", "
                                      "\"json_object\", \"json\", \"regex\" and \"grammar\" are)",
                                      Brief(json(key))));
    }
  }
  return std::nullopt;
}

// value's JSON text with its objects' keys in the order of body_text (the body as received), or
// sorted when there is no text: json sorts keys, and properties are generated in the schema's
// order. `where` is value's dotted place in the body. The body is parsed again only for this.
std::string SchemaText(const json& value, std::string_view body_text, const std::string& where) {
  if (!body_text.empty()) {
    const ordered_json doc = ordered_json::parse(body_text, nullptr, /*allow_exceptions=*/false);
    std::string pointer = "/" + where;
    std::replace(pointer.begin(), pointer.end(), '.', '/');
    const ordered_json::json_pointer at(pointer);
    if (!doc.is_discarded() && doc.contains(at)) return doc.at(at).dump();
  }
  return value.dump();
}

// The one schema's text, checked as the worker will compile it.
Error FinishJsonSchema(GuidedAsk& ask, std::string_view body_text) {
  if (ask.schema) ask.guided.set_json_schema(SchemaText(*ask.schema, body_text, ask.where));
  return CheckJsonSchemaText(ask.guided.json_schema(), ask.field, ask.where);
}

// The one regex, compiled as the worker will, so that a pattern the engine cannot generate exactly
// is a 400 naming the HTTP field and the construct (the gRPC check would name sampling.guided).
Error FinishRegex(const GuidedAsk& ask) {
  const std::string& pattern = ask.guided.regex();
  if (pattern.size() > kMaxRegexBytes) {
    return InvalidField(ask.field, fmt::format("{} is {} bytes, over the limit of {}", ask.field, pattern.size(),
                                               kMaxRegexBytes));
  }
  try {
    CompileRegexCached(pattern);
  } catch (const RegexError& e) {
    return InvalidField(ask.field, fmt::format("{}: {}", ask.field, e.what()));
  }
  return std::nullopt;
}

// The one grammar, expanded and compiled as the scheduler will, so that a recursive one is a 400
// naming the HTTP field, the line and the column.
Error FinishGrammar(const GuidedAsk& ask) {
  const std::string& grammar = ask.guided.grammar();
  if (grammar.size() > kMaxGrammarBytes) {
    return InvalidField(ask.field, fmt::format("{} is {} bytes, over the limit of {}", ask.field, grammar.size(),
                                               kMaxGrammarBytes));
  }
  try {
    CheckGrammarCached(grammar);
  } catch (const GrammarError& e) {
    return InvalidField(ask.field, fmt::format("{}: {}", ask.field, e.what()));
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> CheckJsonSchemaText(const std::string& text, const std::string& field,
                                            const std::string& where) {
  if (text.size() > kMaxGuidedJsonSchemaBytes) {
    return InvalidField(field, fmt::format("{} is {} bytes of JSON, over the limit of {}", where, text.size(),
                                           kMaxGuidedJsonSchemaBytes));
  }
  try {
    CompileJsonSchemaCached(text);
  } catch (const JsonSchemaError& e) {
    return InvalidField(field, fmt::format("{}: {}", where, e.what()));
  }
  return std::nullopt;
}

std::optional<ApiError> ParseGuided(const json& body, std::string_view body_text, ferry::v1::SamplingParams& s) {
  std::vector<GuidedAsk> asks;
  if (Error e = ParseResponseFormat(body, asks)) return e;
  if (Asks(body, "guided_choice")) {
    if (Error e = ParseChoices(body["guided_choice"], "guided_choice", asks)) return e;
  }
  if (Asks(body, "guided_json")) {
    if (Error e = ParseVllmSchema(body["guided_json"], "guided_json", asks)) return e;
  }
  if (Asks(body, "guided_regex")) {
    if (Error e = ParseRegex(body["guided_regex"], "guided_regex", asks)) return e;
  }
  if (Asks(body, "guided_grammar")) {
    if (Error e = ParseGrammar(body["guided_grammar"], "guided_grammar", asks)) return e;
  }
  if (Error e = ParseStructuredOutputs(body, asks)) return e;
  if (asks.size() > 1) {
    return InvalidField(asks[1].field, fmt::format("{} conflicts with {}: a request takes one structured output "
                                                   "constraint", asks[1].field, asks[0].field));
  }
  if (asks.empty()) return std::nullopt;
  if (asks.front().guided.has_json_schema() || asks.front().schema) {
    if (Error e = FinishJsonSchema(asks.front(), body_text)) return e;
  }
  if (asks.front().guided.has_regex()) {
    if (Error e = FinishRegex(asks.front())) return e;
  }
  if (asks.front().guided.has_grammar()) {
    if (Error e = FinishGrammar(asks.front())) return e;
  }
  *s.mutable_guided() = std::move(asks.front().guided);
  return std::nullopt;
}

}  // namespace ferry::gateway::http
