// Structured output over HTTP (guided_format.h): response_format, vLLM's guided_* fields and
// structured_outputs, one constraint per request, each named in its 400s.
#include "gateway/http/guided_format.h"

#include <gtest/gtest.h>

#include "structured/regex_dfa.h"
#include "gateway/http/openai_format_test_util.h"

namespace ferry::gateway::http {
namespace {

TEST(ParseCompletion, StructuredOutputsSetGuidedDecoding) {
  const auto guided = [](const json& extra) {
    json body = {{"prompt", "x"}};
    body.update(extra);
    return ParseOk(body).generate.sampling().guided();
  };
  EXPECT_TRUE(guided({{"response_format", {{"type", "json_object"}}}}).json_object());
  const auto choice = guided({{"guided_choice", {"yes", "no"}}});
  ASSERT_TRUE(choice.has_choice());
  EXPECT_EQ(choice.choice().choices_size(), 2);
  EXPECT_EQ(choice.choice().choices(1), "no");
  EXPECT_EQ(guided({{"structured_outputs", {{"choice", {"a", "b", "c"}}}}}).choice().choices(2), "c");
  EXPECT_TRUE(guided({{"structured_outputs", {{"json_object", true}}}}).json_object());
  // Values that ask for nothing leave the request unconstrained.
  EXPECT_FALSE(ParseOk({{"prompt", "x"}, {"response_format", {{"type", "text"}}}}).generate.sampling().has_guided());
  EXPECT_FALSE(guided({{"structured_outputs", {{"json_object", false}, {"regex", nullptr}}}}).has_json_object());
  EXPECT_FALSE(guided({{"guided_choice", nullptr}}).has_choice());
  // Every choice of a batch carries it.
  OpenAiRequest r = ParseOk({{"prompt", {"a", "b"}}, {"n", 2}, {"guided_choice", {"yes"}}});
  for (const auto& c : ExpandChoices(r)) EXPECT_EQ(c.sampling().guided().choice().choices(0), "yes");
}

TEST(ParseCompletion, BadStructuredOutputsAreNamed) {
  const auto error = [](const json& extra) {
    json body = {{"prompt", "x"}};
    body.update(extra);
    return ParseError(body);
  };
  EXPECT_EQ(error({{"guided_choice", "yes"}}).param, "guided_choice");
  EXPECT_EQ(error({{"guided_choice", 5}}).param, "guided_choice");
  const ApiError item = error({{"guided_choice", {"yes", 7}}});
  EXPECT_EQ(item.param, "guided_choice[1]");
  EXPECT_EQ(item.message, "guided_choice[1] must be a string, got number (7)");
  EXPECT_EQ(error({{"structured_outputs", "json"}}).param, "structured_outputs");
  EXPECT_EQ(error({{"structured_outputs", {{"choice", "yes"}}}}).param, "structured_outputs.choice");
  EXPECT_EQ(error({{"structured_outputs", {{"choice", json::array({nullptr})}}}}).param,
            "structured_outputs.choice[0]");
  EXPECT_EQ(error({{"structured_outputs", {{"json_object", 1}}}}).param, "structured_outputs.json_object");
  const ApiError tag = error({{"structured_outputs", {{"structural_tag", "x"}}}});
  EXPECT_EQ(tag.param, "structured_outputs");
  EXPECT_NE(tag.message.find("structural_tag"), std::string::npos) << tag.message;
  const ApiError left = error({{"structured_outputs", {{"grammar", "root ::= root \")\" | \"x\""}}}});
  EXPECT_EQ(left.param, "structured_outputs.grammar");
  EXPECT_NE(left.message.find("structured_outputs.grammar: grammar at line 1, column 10: rule \"root\" is "
                              "left-recursive (root -> root before any text is read)"),
            std::string::npos)
      << left.message;
  EXPECT_EQ(error({{"guided_grammar", 3}}).param, "guided_grammar");
}

TEST(ParseCompletion, GrammarsAreOneConstraint) {
  const std::string sql = "root ::= \"SELECT \" col\ncol ::= \"a\" | \"b\"";
  EXPECT_EQ(ParseOk({{"prompt", "x"}, {"guided_grammar", sql}}).generate.sampling().guided().grammar(), sql);
  EXPECT_EQ(ParseOk({{"prompt", "x"}, {"structured_outputs", {{"grammar", sql}}}}).generate.sampling().guided().grammar(),
            sql);
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"guided_grammar", sql}, {"guided_regex", "a"}}).param, "guided_grammar");
}

TEST(ParseCompletion, OneStructuredOutputConstraintAtATime) {
  const json json_object = {{"type", "json_object"}};
  const ApiError two = ParseError({{"prompt", "x"}, {"response_format", json_object}, {"guided_choice", {"a"}}});
  EXPECT_EQ(two.param, "guided_choice");
  EXPECT_EQ(two.message, "guided_choice conflicts with response_format: a request takes one structured output "
                         "constraint");
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"guided_choice", {"a"}}, {"structured_outputs", {{"choice", {"b"}}}}}).param,
            "structured_outputs.choice");
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"structured_outputs", {{"choice", {"b"}}, {"json_object", true}}}}).param,
            "structured_outputs.json_object");
  const json both = {{"prompt", "x"}, {"response_format", json_object}, {"structured_outputs", {{"json_object", true}}}};
  EXPECT_EQ(ParseError(both).param, "structured_outputs.json_object");
}

// A schema's text as sent on, parsed from the body's text (as the server does) so that its keys
// keep their order.
std::string SchemaSent(const std::string& body_text) {
  auto r = ParseCompletionRequest(json::parse(body_text), body_text);
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << e->message;
    return {};
  }
  return std::get<OpenAiRequest>(r).generate.sampling().guided().json_schema();
}

TEST(ParseCompletion, JsonSchemaKeepsTheSchemasKeyOrder) {
  const std::string schema = R"({"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"string"}},)"
                             R"("required":["b","a"]})";
  // json sorts keys ("a" before "b"); the text sent on is the body's, b first.
  EXPECT_EQ(SchemaSent(R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": )"
                       R"({"name": "t", "strict": true, "schema": )" + schema + "}}}"),
            schema);
  EXPECT_EQ(SchemaSent(R"({"prompt": "x", "guided_json": )" + schema + "}"), schema);
  EXPECT_EQ(SchemaSent(R"({"prompt": "x", "structured_outputs": {"json": )" + schema + "}}"), schema);
  // Without the body's text (a caller that has only the tree), the keys come sorted.
  const OpenAiRequest sorted = ParseOk({{"prompt", "x"}, {"guided_json", json::parse(schema)}});
  const std::string& text = sorted.generate.sampling().guided().json_schema();
  EXPECT_LT(text.find("\"a\":"), text.find("\"b\":")) << text;
}

TEST(ParseChat, JsonSchemaKeepsTheSchemasKeyOrder) {
  const std::string schema = R"({"type":"object","properties":{"zeta":{"type":"boolean"},"alpha":{"type":"null"}}})";
  const std::string body = R"({"messages": [{"role": "user", "content": "hi"}], "response_format": )"
                           R"({"type": "json_schema", "json_schema": {"name": "t", "schema": )" + schema + "}}}";
  auto parsed = ParseChatRequest(json::parse(body), Qwen(), body);
  ASSERT_TRUE(std::holds_alternative<OpenAiRequest>(parsed)) << std::get<ApiError>(parsed).message;
  EXPECT_EQ(std::get<OpenAiRequest>(parsed).generate.sampling().guided().json_schema(), schema);
}

TEST(ParseCompletion, JsonSchemaForms) {
  const auto guided = [](const json& extra) {
    json body = {{"prompt", "x"}};
    body.update(extra);
    return ParseOk(body).generate.sampling().guided();
  };
  const json schema = {{"type", "object"}, {"properties", {{"n", {{"type", "integer"}}}}}};
  const json format = {{"type", "json_schema"}, {"json_schema", {{"name", "n"}, {"schema", schema}}}};
  EXPECT_EQ(guided({{"response_format", format}}).json_schema(), schema.dump());
  json not_strict = format;
  not_strict["json_schema"]["strict"] = false;  // kept all the same: the engine always keeps it
  EXPECT_EQ(guided({{"response_format", not_strict}}).json_schema(), schema.dump());
  json any = format;
  any["json_schema"]["schema"] = true;  // a boolean schema: any value
  EXPECT_EQ(guided({{"response_format", any}}).json_schema(), "true");
  EXPECT_EQ(guided({{"guided_json", schema}}).json_schema(), schema.dump());
  // A string holding the schema goes on as written, spaces and key order included.
  const std::string text = R"({"type": "object", "properties": {"z": {"type": "string"}, "a": {}}})";
  EXPECT_EQ(guided({{"guided_json", text}}).json_schema(), text);
  EXPECT_EQ(guided({{"structured_outputs", {{"json", text}}}}).json_schema(), text);
  EXPECT_EQ(guided({{"structured_outputs", {{"json", schema}}}}).json_schema(), schema.dump());
  // Values that ask for nothing leave the request unconstrained.
  EXPECT_FALSE(guided({{"guided_json", json::object()}}).has_json_schema());
  EXPECT_FALSE(guided({{"structured_outputs", {{"json", json::object()}}}}).has_json_schema());
  EXPECT_FALSE(guided({{"structured_outputs", {{"json", nullptr}}}}).has_json_schema());
}

TEST(ParseCompletion, BadJsonSchemasAreNamed) {
  const auto error = [](const json& extra) {
    json body = {{"prompt", "x"}};
    body.update(extra);
    return ParseError(body);
  };
  const auto format = [](const json& spec) {
    return json{{"response_format", {{"type", "json_schema"}, {"json_schema", spec}}}};
  };
  EXPECT_EQ(error({{"response_format", {{"type", "json_schema"}}}}).param, "response_format.json_schema");
  EXPECT_EQ(error(format("schema")).param, "response_format.json_schema");
  EXPECT_EQ(error(format({{"name", "x"}})).message,
            "response_format.json_schema.schema is required (a JSON schema: an object or a boolean)");
  const ApiError text = error(format({{"schema", "{}"}}));
  EXPECT_EQ(text.param, "response_format.json_schema.schema");
  EXPECT_EQ(text.message, "response_format.json_schema.schema must be a JSON schema (an object or a boolean), got "
                          "string (\"{}\")");
  EXPECT_EQ(error(format({{"schema", 5}})).param, "response_format.json_schema.schema");
  EXPECT_EQ(error(format({{"schema", json::object()}, {"strict", "yes"}})).param, "response_format.json_schema.strict");
  EXPECT_EQ(error({{"guided_json", 5}}).param, "guided_json");
  EXPECT_EQ(error({{"structured_outputs", {{"json", json::array({1})}}}}).param, "structured_outputs.json");

  // What the engine cannot keep: a 400 naming the field that gave the schema and the keyword.
  const json min_length = {{"type", "string"}, {"minLength", -3}};
  const ApiError compiled = error(format({{"schema", min_length}}));
  EXPECT_EQ(compiled.param, "response_format");
  EXPECT_EQ(compiled.message,
            "response_format.json_schema.schema: schema at /: \"minLength\" must be a non-negative integer");
  const json nested = {{"type", "object"}, {"properties", {{"age", {{"type", "integer"}, {"multipleOf", 2}}}}}};
  const ApiError in_guided_json = error({{"guided_json", nested}});
  EXPECT_EQ(in_guided_json.param, "guided_json");
  EXPECT_EQ(in_guided_json.message, "guided_json: schema at /properties/age: \"multipleOf\" is not supported");
  const ApiError not_json = error({{"structured_outputs", {{"json", "{\"type\": "}}}});
  EXPECT_EQ(not_json.param, "structured_outputs.json");
  EXPECT_EQ(not_json.message.rfind("structured_outputs.json: schema is not JSON", 0), 0u) << not_json.message;
  EXPECT_EQ(error(format({{"schema", false}})).param, "response_format");  // accepts no value

  const std::string large = R"({"type": "object"})" + std::string(64 * 1024, ' ');
  const ApiError too_large = error({{"guided_json", large}});
  EXPECT_EQ(too_large.param, "guided_json");
  EXPECT_EQ(too_large.message, "guided_json is 65554 bytes of JSON, over the limit of 65536");
}

TEST(ParseCompletion, AJsonSchemaIsOneConstraintToo) {
  const json format = {{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "object"}}}}}};
  const json string = {{"type", "string"}};
  const ApiError two = ParseError({{"prompt", "x"}, {"response_format", format}, {"guided_json", string}});
  EXPECT_EQ(two.param, "guided_json");
  EXPECT_EQ(two.message,
            "guided_json conflicts with response_format: a request takes one structured output constraint");
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"guided_choice", {"a"}}, {"structured_outputs", {{"json", "{}"}}}}).param,
            "structured_outputs.json");
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"guided_json", "{}"}, {"guided_choice", {"a"}}}).param, "guided_json");
}

TEST(ParseCompletion, RegexForms) {
  const auto guided = [](const json& extra) {
    json body = {{"prompt", "x"}};
    body.update(extra);
    return ParseOk(body).generate.sampling().guided();
  };
  const std::string pattern = R"((?:yes|no)-\d{2,4}[a-f]*)";
  const auto from_guided_regex = guided({{"guided_regex", pattern}});
  ASSERT_TRUE(from_guided_regex.has_regex());
  EXPECT_EQ(from_guided_regex.regex(), pattern);  // sent on as written
  EXPECT_EQ(guided({{"structured_outputs", {{"regex", pattern}}}}).regex(), pattern);
  const std::string at_limit = "[" + std::string(kMaxRegexBytes - 2, 'a') + "]";  // 4,096 bytes, 2 states
  EXPECT_EQ(guided({{"guided_regex", at_limit}}).regex().size(), kMaxRegexBytes);
  // An empty pattern is a constraint, as over gRPC: only the empty text matches it.
  const auto empty = guided({{"guided_regex", ""}});
  ASSERT_TRUE(empty.has_regex());
  EXPECT_EQ(empty.regex(), "");
  EXPECT_TRUE(guided({{"structured_outputs", {{"regex", ""}}}}).has_regex());
  // null leaves the request unconstrained.
  EXPECT_FALSE(guided({{"guided_regex", nullptr}}).has_regex());
  EXPECT_FALSE(guided({{"structured_outputs", {{"regex", nullptr}}}}).has_regex());
}

TEST(ParseCompletion, BadRegexesAreNamed) {
  const auto error = [](const json& extra) {
    json body = {{"prompt", "x"}};
    body.update(extra);
    return ParseError(body);
  };
  const ApiError number = error({{"guided_regex", 5}});
  EXPECT_EQ(number.param, "guided_regex");
  EXPECT_EQ(number.message, "guided_regex must be a string (a regular expression), got number (5)");
  EXPECT_EQ(error({{"guided_regex", {"a"}}}).param, "guided_regex");
  EXPECT_EQ(error({{"structured_outputs", {{"regex", json::array()}}}}).param, "structured_outputs.regex");
  // What the engine cannot generate exactly: a 400 naming the field and the construct.
  const ApiError backreference = error({{"guided_regex", R"((a)\1)"}});
  EXPECT_EQ(backreference.param, "guided_regex");
  EXPECT_EQ(backreference.message,
            "guided_regex: regex at byte 4: backreferences and octal escapes are not supported");
  const ApiError lookahead = error({{"structured_outputs", {{"regex", "(?=a)b"}}}});
  EXPECT_EQ(lookahead.param, "structured_outputs.regex");
  EXPECT_EQ(lookahead.message,
            "structured_outputs.regex: regex at byte 1: '(?' forms other than (?:...) are not supported");
  const ApiError too_large = error({{"guided_regex", std::string(kMaxRegexBytes + 1, 'a')}});
  EXPECT_EQ(too_large.param, "guided_regex");
  EXPECT_EQ(too_large.message, "guided_regex is 4097 bytes, over the limit of 4096");
}

TEST(ParseCompletion, ARegexIsOneConstraintToo) {
  const ApiError two = ParseError({{"prompt", "x"}, {"guided_choice", {"a"}}, {"guided_regex", "a|b"}});
  EXPECT_EQ(two.param, "guided_regex");
  EXPECT_EQ(two.message,
            "guided_regex conflicts with guided_choice: a request takes one structured output constraint");
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"guided_regex", "a"}, {"structured_outputs", {{"regex", "b"}}}}).param,
            "structured_outputs.regex");
  // The conflict is named before a pattern that would not compile: it is not the one constraint.
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"guided_json", "{}"}, {"guided_regex", "(a)\\1"}}).message,
            "guided_regex conflicts with guided_json: a request takes one structured output constraint");
}

TEST(ParseChat, ResponseFormatJsonObjectGuidedChoiceAndGuidedRegex) {
  json body = {{"messages", {{{"role", "user"}, {"content", "Reply in JSON"}}}},
               {"response_format", {{"type", "json_object"}}}};
  auto parsed = ParseChatRequest(body, Qwen());
  ASSERT_TRUE(std::holds_alternative<OpenAiRequest>(parsed)) << std::get<ApiError>(parsed).message;
  EXPECT_TRUE(std::get<OpenAiRequest>(parsed).generate.sampling().guided().json_object());
  body.erase("response_format");
  body["guided_choice"] = {"positive", "negative"};
  parsed = ParseChatRequest(body, Qwen());
  ASSERT_TRUE(std::holds_alternative<OpenAiRequest>(parsed)) << std::get<ApiError>(parsed).message;
  EXPECT_EQ(std::get<OpenAiRequest>(parsed).generate.sampling().guided().choice().choices(0), "positive");

  body.erase("guided_choice");
  body["guided_regex"] = "(positive|negative)";
  parsed = ParseChatRequest(body, Qwen());
  ASSERT_TRUE(std::holds_alternative<OpenAiRequest>(parsed)) << std::get<ApiError>(parsed).message;
  EXPECT_EQ(std::get<OpenAiRequest>(parsed).generate.sampling().guided().regex(), "(positive|negative)");
}

}  // namespace
}  // namespace ferry::gateway::http
