// Every request field the OpenAI parsers read, given every kind of JSON value (and the bodies
// that are not objects at all): each parse returns a request or a 400 that names the field,
// and never throws. A throw here would reach cpp-httplib as a 500 with no message.
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gateway/tokenizer/bpe_trainer.h"
#include "gateway/http/openai_format.h"
#include "gateway/http/tokenize_api.h"

namespace ferry::gateway::http {
namespace {

const std::vector<std::string> kFields = {
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
    "min_p", "n", "best_of", "stop", "stop_token_ids", "seed", "logprobs", "top_logprobs", "echo", "suffix",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "min_tokens", "ignore_eos",
    "stream", "stream_options", "lane", "timeout_ms", "user", "tools", "tool_choice", "functions",
    "function_call", "response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
    "structured_outputs", "parallel_tool_calls", "use_beam_search", "length_penalty", "early_stopping", "bad_words",
    "allowed_token_ids", "truncate_prompt_tokens", "include_stop_str_in_output", "skip_special_tokens",
    "spaces_between_special_tokens", "guided_whitespace_pattern", "logits_processors", "return_tokens_as_token_ids",
    "priority", "continue_final_message", "add_generation_prompt", "chat_template", "chat_template_kwargs",
    "documents"};

// Values of every JSON type, at and past the edges the parsers convert to (int32, uint64, float).
std::vector<json> Values() {
  return {nullptr,
          true,
          false,
          0,
          -1,
          1,
          2147483647,
          2147483648LL,
          -2147483649LL,
          json(18446744073709551615ULL),
          json(-9223372036854775807LL - 1),
          0.5,
          -0.0,
          1e300,
          -1e300,
          "",
          "x",
          "\u00e9\u4e2d",  // json::parse refuses invalid UTF-8, so a body's strings are valid
          json::array(),
          json::array({1, 2}),
          json::array({"a", nullptr}),
          json::array({json::array({1, "x"})}),
          json::array({json::object({{"role", "user"}, {"content", 5}})}),
          json::array({json::object({{"role", 7}})}),
          json::object(),
          json::object({{"include_usage", "yes"}}),
          json::object({{"type", "json_object"}}),
          json::object({{"12", 200}}),
          json::object({{"-5", 1}}),
          json::object({{"abc", 1}}),
          json::object({{"99999999999999999999", 1}}),
          json::object({{"3", "x"}})};
}

std::string Dump(const json& body) { return body.dump(-1, ' ', false, json::error_handler_t::replace); }

// Parses with `parse` and checks it neither throws nor returns an error without a message.
template <typename Parse>
void ExpectCleanOutcome(const json& body, Parse parse) {
  std::variant<OpenAiRequest, ApiError> out;
  ASSERT_NO_THROW(out = parse(body)) << Dump(body);
  if (const auto* error = std::get_if<ApiError>(&out)) {
    EXPECT_EQ(error->http_status, 400) << Dump(body);
    EXPECT_FALSE(error->message.empty()) << Dump(body);
    return;
  }
  const auto& request = std::get<OpenAiRequest>(out);
  EXPECT_FALSE(request.prompts.empty()) << Dump(body);
  std::vector<ferry::v1::GenerateRequest> choices;
  ASSERT_NO_THROW(choices = ExpandChoices(request)) << Dump(body);
  EXPECT_EQ(choices.size(), static_cast<size_t>(request.n) * request.prompts.size()) << Dump(body);
}

const ChatTemplate& Template() {
  static const ChatTemplate t = ChatTemplate::FromTemplateText(std::string(tokenizer::Qwen25ChatTemplate()));
  return t;
}

TEST(OpenAiFuzz, EveryFieldWithEveryJsonTypeGivesARequestOrA400) {
  const json completion = {{"prompt", "hi"}, {"max_tokens", 4}};
  const json chat = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  for (const std::string& field : kFields) {
    for (const json& value : Values()) {
      json a = completion;
      a[field] = value;
      ExpectCleanOutcome(a, [](const json& b) { return ParseCompletionRequest(b); });
      json c = chat;
      c[field] = value;
      ExpectCleanOutcome(c, [](const json& b) { return ParseChatRequest(b, Template()); });
    }
  }
}

TEST(OpenAiFuzz, BodiesThatAreNotObjectsGiveA400) {
  for (const json& body : Values()) {
    if (body.is_object()) continue;
    ExpectCleanOutcome(body, [](const json& b) { return ParseCompletionRequest(b); });
    ExpectCleanOutcome(body, [](const json& b) { return ParseChatRequest(b, Template()); });
    EXPECT_TRUE(std::holds_alternative<ApiError>(ParseCompletionRequest(body))) << Dump(body);
  }
}

TEST(OpenAiFuzz, NestedObjectFieldsWithEveryJsonType) {
  for (const auto& [outer, inner] :
       {std::pair{"response_format", "type"}, {"stream_options", "include_usage"}, {"structured_outputs", "choice"},
        {"structured_outputs", "json_object"}, {"structured_outputs", "json"}, {"structured_outputs", "regex"}}) {
    for (const json& value : Values()) {
      json body = {{"prompt", "hi"}};
      body[outer] = json{{inner, value}};
      ExpectCleanOutcome(body, [](const json& b) { return ParseCompletionRequest(b); });
    }
  }
}

// The choice lists (guided_choice, structured_outputs.choice) with an entry of every JSON type,
// and each structured output constraint (a regex too) beside another.
TEST(OpenAiFuzz, StructuredOutputsWithEveryJsonType) {
  for (const json& value : Values()) {
    const json choices = json::array({"ok", value});
    ExpectCleanOutcome(json{{"prompt", "hi"}, {"guided_choice", choices}},
                       [](const json& b) { return ParseCompletionRequest(b); });
    ExpectCleanOutcome(json{{"prompt", "hi"}, {"structured_outputs", {{"choice", choices}}}},
                       [](const json& b) { return ParseCompletionRequest(b); });
    ExpectCleanOutcome(json{{"prompt", "hi"}, {"response_format", {{"type", "json_object"}}}, {"guided_choice", value}},
                       [](const json& b) { return ParseCompletionRequest(b); });
    ExpectCleanOutcome(json{{"prompt", "hi"}, {"guided_regex", "[a-z]+"}, {"structured_outputs", {{"regex", value}}}},
                       [](const json& b) { return ParseCompletionRequest(b); });
    ExpectCleanOutcome(json{{"prompt", "hi"}, {"guided_choice", {"a"}}, {"guided_regex", value}},
                       [](const json& b) { return ParseCompletionRequest(b); });
  }
}

// Patterns of regex syntax's characters, mostly malformed: each compiles or is a 400 naming the
// field, never another exception (which would reach cpp-httplib as a 500).
TEST(OpenAiFuzz, RandomRegexesGiveARequestOrA400) {
  const std::string alphabet = "ab.()[]{}|*+?^$\\-,:=!<P1209dwsSxu";
  std::mt19937 rng(11);
  for (int i = 0; i < 3000; ++i) {
    std::string pattern;
    for (size_t n = 1 + rng() % 12; n-- > 0;) pattern += alphabet[rng() % alphabet.size()];
    const char* field = i % 2 == 0 ? "guided_regex" : "structured_outputs";
    const json body = i % 2 == 0 ? json{{"prompt", "hi"}, {"guided_regex", pattern}}
                                 : json{{"prompt", "hi"}, {"structured_outputs", {{"regex", pattern}}}};
    ExpectCleanOutcome(body, [](const json& b) { return ParseCompletionRequest(b); });
    const auto out = ParseCompletionRequest(body);
    if (const auto* e = std::get_if<ApiError>(&out)) {
      EXPECT_EQ(e->param.rfind(field, 0), 0u) << pattern << ": " << e->message;
    }
  }
}

// response_format json_schema's parts with every JSON type, parsed from the tree and from the
// body's text (whose schema is read again, in order).
TEST(OpenAiFuzz, JsonSchemaWithEveryJsonType) {
  const auto both = [](const json& body) {
    ExpectCleanOutcome(body, [](const json& b) { return ParseCompletionRequest(b); });
    ExpectCleanOutcome(body, [](const json& b) { return ParseCompletionRequest(b, Dump(b)); });
  };
  for (const json& value : Values()) {
    for (const char* key : {"schema", "strict", "name"}) {
      json spec = {{"schema", {{"type", "object"}}}};
      spec[key] = value;
      both(json{{"prompt", "hi"}, {"response_format", {{"type", "json_schema"}, {"json_schema", spec}}}});
    }
    both(json{{"prompt", "hi"}, {"response_format", {{"type", "json_schema"}, {"json_schema", value}}}});
    both(json{{"prompt", "hi"}, {"guided_json", {{"type", "object"}, {"properties", {{"p", value}}}}}});
    both(json{{"prompt", "hi"}, {"structured_outputs", {{"json", {{"type", "array"}, {"items", value}}}}}});
  }
}

TEST(OpenAiFuzz, ContentPartFieldsWithEveryJsonType) {
  for (const char* field : {"type", "text"}) {
    for (const json& value : Values()) {
      json part = {{"type", "text"}, {"text", "hi"}};
      part[field] = value;
      const json body = {{"messages", json::array({{{"role", "user"}, {"content", json::array({part})}}})}};
      ExpectCleanOutcome(body, [](const json& b) { return ParseChatRequest(b, Template()); });
    }
  }
}

TEST(OpenAiFuzz, MessageFieldsWithEveryJsonType) {
  for (const char* field : {"role", "content", "name"}) {
    for (const json& value : Values()) {
      json message = {{"role", "user"}, {"content", "hi"}};
      message[field] = value;
      ExpectCleanOutcome(json{{"messages", json::array({message})}},
                         [](const json& b) { return ParseChatRequest(b, Template()); });
    }
  }
}

TEST(OpenAiFuzz, TokenIdsPastInt32AreRefusedNotWrapped) {
  for (const json& prompt : {json{1, 4294967297LL}, json{json{1}, json{-2147483649LL}},
                             json{json(18446744073709551615ULL)}}) {
    const auto out = ParseCompletionRequest({{"prompt", prompt}});
    ASSERT_TRUE(std::holds_alternative<ApiError>(out)) << Dump(prompt);
    const ApiError& e = std::get<ApiError>(out);
    EXPECT_EQ(e.param, "prompt");
    EXPECT_NE(e.message.find("is not a token id"), std::string::npos) << e.message;
  }
  EXPECT_EQ(std::get<ApiError>(ParseCompletionRequest({{"prompt", {1, 4294967297LL}}})).message,
            "prompt[1] = 4294967297 is not a token id");
  auto error = std::get<ApiError>(ParseCompletionRequest({{"prompt", "x"}, {"stop_token_ids", {4294967297LL}}}));
  EXPECT_EQ(error.message, "stop_token_ids value 4294967297 is not a token id");
  error = std::get<ApiError>(ParseCompletionRequest({{"prompt", "x"}, {"max_tokens", 18446744073709551615ULL}}));
  EXPECT_EQ(error.message, "max_tokens = 18446744073709551615 is out of range");
  const auto ok = ParseCompletionRequest({{"prompt", {0, 2147483647}}});
  ASSERT_TRUE(std::holds_alternative<OpenAiRequest>(ok));  // int32 ids pass; the vocabulary is checked later
  EXPECT_EQ(std::get<OpenAiRequest>(ok).prompts[0].token_ids().ids(1), 2147483647);
}

TEST(OpenAiFuzz, TokenizerApiFieldsWithEveryJsonType) {
  for (const char* field : {"prompt", "messages", "tokens", "add_special_tokens", "add_generation_prompt", "model"}) {
    for (const json& value : Values()) {
      for (json body : {json{{"prompt", "hi"}}, json{{"tokens", {1, 2}}}}) {
        body[field] = value;
        std::variant<std::string, ApiError> text;
        ASSERT_NO_THROW(text = ParseTokenizeRequest(body, Template())) << Dump(body);
        std::variant<std::vector<int32_t>, ApiError> ids;
        ASSERT_NO_THROW(ids = ParseDetokenizeRequest(body, 500)) << Dump(body);
        if (const auto* error = std::get_if<ApiError>(&ids)) EXPECT_FALSE(error->message.empty());
      }
    }
  }
  for (const json& body : Values()) {  // not objects, or empty ones
    EXPECT_NO_THROW(ParseTokenizeRequest(body, Template())) << Dump(body);
    EXPECT_NO_THROW(ParseDetokenizeRequest(body, 500)) << Dump(body);
  }
}

TEST(TokenizerApi, ParsesWhatVllmTakes) {
  EXPECT_EQ(std::get<std::string>(ParseTokenizeRequest({{"prompt", "hi"}, {"add_special_tokens", true}}, Template())),
            "hi");
  const auto chat = ParseTokenizeRequest({{"messages", {{{"role", "user"}, {"content", "hi"}}}}}, Template());
  ASSERT_TRUE(std::holds_alternative<std::string>(chat));
  EXPECT_NE(std::get<std::string>(chat).find("<|im_start|>assistant\n"), std::string::npos);
  const auto no_turn = ParseTokenizeRequest(
      {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"add_generation_prompt", false}}, Template());
  ASSERT_TRUE(std::holds_alternative<std::string>(no_turn));
  EXPECT_TRUE(std::get<std::string>(no_turn).ends_with("hi<|im_end|>\n"));
  auto error = std::get<ApiError>(
      ParseTokenizeRequest({{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"add_generation_prompt", "no"}},
                           Template()));
  EXPECT_EQ(error.param, "add_generation_prompt");
  error = std::get<ApiError>(ParseTokenizeRequest(json::object(), Template()));
  EXPECT_EQ(error.message, "set exactly one of prompt and messages");
  EXPECT_EQ(std::get<std::vector<int32_t>>(ParseDetokenizeRequest({{"tokens", {3, 499}}}, 500)),
            (std::vector<int32_t>{3, 499}));
  error = std::get<ApiError>(ParseDetokenizeRequest({{"tokens", {3, 500}}}, 500));
  EXPECT_EQ(error.message, "tokens[1] = 500 is not a token id in [0, 500)");
  EXPECT_EQ(TokenizeResponseJson({5, 6}, 64).dump(), R"({"count":2,"max_model_len":64,"tokens":[5,6]})");
}

TEST(OpenAiFuzz, NestingIsCountedOutsideStringsOnly) {
  EXPECT_FALSE(NestsDeeperThan(R"({"a": [[1]]})", 3));
  EXPECT_TRUE(NestsDeeperThan(R"({"a": [[[1]]]})", 3));
  EXPECT_FALSE(NestsDeeperThan(R"({"a": "[[[[[[", "b": "\"[[[["})", 1));  // brackets in strings
  EXPECT_TRUE(NestsDeeperThan(std::string(100'000, '['), kMaxJsonDepth));  // unbalanced too
  EXPECT_FALSE(NestsDeeperThan("", kMaxJsonDepth));
}

TEST(OpenAiFuzz, BriefCutsLongAndDeepValues) {
  EXPECT_EQ(Brief(json(0.5)), "0.5");
  EXPECT_EQ(Brief(json::array({1, 2})), "[1, 2]");
  EXPECT_EQ(Brief(json::array({1, 2, 3, 4, 5, 6})), "[1, 2, 3, 4, ... (6 in all)]");
  EXPECT_EQ(Brief(json::parse("[[[[1]]]]")), "[[[...]]]");
  EXPECT_EQ(Brief(json{{"k", "v"}}), R"({"k": "v"})");
  const std::string long_text(1000, 'a');
  EXPECT_EQ(Brief(json(long_text)), "\"" + std::string(48, 'a') + "...\"");
  // A cut never splits a character: 47 ASCII bytes, then a 2-byte character across the cut.
  const std::string s = std::string(47, 'a') + "\u00e9" + std::string(10, 'b');
  EXPECT_EQ(Brief(json(s)), "\"" + std::string(47, 'a') + "...\"");
}

}  // namespace
}  // namespace ferry::gateway::http
