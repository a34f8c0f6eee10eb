// The Responses API translation (responses_format.h), without sockets (its store:
// response_store_test.cc). End to end, with the official openai client: tests/python/test_openai_responses.py.
#include "gateway/http/responses_format.h"

#include <gtest/gtest.h>

#include "gateway/tokenizer/bpe_trainer.h"

namespace ferry::gateway::http {
namespace {

const ChatTemplate& Qwen() {
  static const ChatTemplate t = ChatTemplate::FromTemplateText(std::string(tokenizer::Qwen25ChatTemplate()));
  return t;
}

constexpr const char* kWeather =
    R"({"type": "function", "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}})";

ResponsesRequest Parse(const std::string& text, const std::vector<ChatMessage>* previous = nullptr) {
  auto r = ParseResponsesRequest(json::parse(text), text, Qwen(), previous);
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << e->param << ": " << e->message;
  return std::holds_alternative<ResponsesRequest>(r) ? std::get<ResponsesRequest>(r) : ResponsesRequest{};
}

ApiError Refusal(const std::string& text, const std::vector<ChatMessage>* previous = nullptr) {
  auto r = ParseResponsesRequest(json::parse(text), text, Qwen(), previous);
  if (std::holds_alternative<ResponsesRequest>(r)) ADD_FAILURE() << "parsed: " << text;
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

TEST(ParseResponses, InstructionsAndTextInputAreAChat) {
  const ResponsesRequest r =
      Parse(R"({"model": "m", "instructions": "Be brief.", "input": "Hi", "max_output_tokens": 7,
                "temperature": 0.5, "top_p": 0.9, "metadata": {"k": "v"}})");
  EXPECT_EQ(r.chat.generate.text(), "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                                    "<|im_start|>assistant\n");
  EXPECT_EQ(r.chat.generate.sampling().max_tokens(), 7);
  EXPECT_FLOAT_EQ(r.chat.generate.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(r.chat.generate.sampling().top_p(), 0.9f);
  EXPECT_EQ(r.chat.model, "m");
  EXPECT_TRUE(r.store);
  // The history a continuation starts from: the input, not the instructions (OpenAI's rule).
  ASSERT_EQ(r.history.size(), 1u);
  EXPECT_EQ(r.history[0].role, "user");
  EXPECT_EQ(r.history[0].content, "Hi");
  EXPECT_EQ(r.echo["instructions"], "Be brief.");
  EXPECT_EQ(r.echo["metadata"], json::parse(R"({"k": "v"})"));
  EXPECT_EQ(r.echo["tool_choice"], "auto");
}

TEST(ParseResponses, ItemsToolsAndPreviousHistory) {
  const std::vector<ChatMessage> previous = {{"user", "Weather in Oslo?", {}}};
  const ResponsesRequest r = Parse(std::string(R"({"input": [
      {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
      {"role": "developer", "content": [{"type": "input_text", "text": "Answer "}, {"type": "input_text", "text": "now."}]}],
    "tools": [)") + kWeather + "]}",
                                   &previous);
  const std::string& prompt = r.chat.generate.text();
  EXPECT_NE(prompt.find("<|im_start|>user\nWeather in Oslo?<|im_end|>"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}"), std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find("<tool_response>\nsunny\n</tool_response>"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("\"name\": \"get_weather\", \"description\": \"Weather in a city\""), std::string::npos)
      << "the tool is rendered in its chat form, keys in the request's order: " << prompt;
  EXPECT_EQ(r.chat.tools.choice, ToolsRequest::Choice::kAuto);
  ASSERT_EQ(r.history.size(), 4u);  // previous + the call turn + its output + the developer's message
  ASSERT_EQ(r.history[1].tool_calls.size(), 1u);
  EXPECT_EQ(r.history[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.history[1].tool_calls[0].arguments, nlohmann::ordered_json({{"city", "Oslo"}}));
  EXPECT_EQ(r.history[2].role, "tool");
  EXPECT_EQ(r.history[2].tool_call_id, r.history[1].tool_calls[0].id) << "the call and its output keep their id";
  EXPECT_EQ(r.history[3].role, "system");
}

TEST(ParseResponses, TextFormatAndNamedToolChoiceBecomeStructuredOutput) {
  const ResponsesRequest schema = Parse(R"({"input": "Hi", "text": {"format": {"type": "json_schema",
      "name": "answer", "schema": {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}},
      "required": ["b", "a"]}, "strict": true}}})");
  EXPECT_NE(schema.chat.generate.sampling().guided().json_schema().find(R"("b")"), std::string::npos);
  const ResponsesRequest named = Parse(std::string(R"({"input": "Hi", "tools": [)") + kWeather +
                                       R"(], "tool_choice": {"type": "function", "name": "get_weather"}})");
  EXPECT_EQ(named.chat.tools.choice, ToolsRequest::Choice::kNamed);
  EXPECT_EQ(named.chat.generate.sampling().guided().json_schema(), named.chat.tools.named_schema);
}

TEST(ParseResponses, RefusalsNameTheField) {
  EXPECT_EQ(Refusal(R"({"input": "Hi", "frequency_penalty_x": 1})").param, "frequency_penalty_x");
  EXPECT_EQ(Refusal(R"({"model": "m"})").param, "input");
  EXPECT_EQ(Refusal(R"({"input": 5})").param, "input");
  EXPECT_EQ(Refusal(R"({"input": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]})").param,
            "input[1].role");
  EXPECT_EQ(Refusal(R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]})").param,
            "input[0].content[0].type");
  EXPECT_EQ(Refusal(R"({"input": [{"type": "function_call_output", "output": "x"}]})").param, "input[0].call_id");
  EXPECT_EQ(Refusal(R"({"input": [{"type": "reasoning", "summary": []}]})").param, "input[0].type");
  EXPECT_EQ(Refusal(R"({"input": "Hi", "tools": [{"type": "web_search"}]})").param, "tools[0].type");
  EXPECT_EQ(Refusal(R"({"input": "Hi", "text": {"format": {"type": "xml"}}})").param, "text.format.type");
  EXPECT_EQ(Refusal(R"({"input": "Hi", "reasoning": {"effort": "high"}})").param, "reasoning");
  EXPECT_EQ(Refusal(R"({"input": "Hi", "background": true})").param, "background");
  EXPECT_EQ(Refusal(R"({"input": "Hi", "store": "yes"})").param, "store");
  const ApiError max = Refusal(R"({"input": "Hi", "max_output_tokens": 0})");
  EXPECT_EQ(max.param, "max_output_tokens") << max.message;
  EXPECT_EQ(max.message, "max_output_tokens = 0 must be >= 1");
  EXPECT_EQ(Refusal(R"({"input": "Hi", "max_output_tokens": "9"})").param, "max_output_tokens");
  EXPECT_EQ(Refusal(R"({"input": "Hi", "max_output_tokens": 4294967296})").message,
            "max_output_tokens = 4294967296 is out of range");
}

// Every error is named where the Responses request is read, in its terms: none speaks of chat's
// messages, response_format, max_tokens or tools[i].function.
TEST(ParseResponses, ErrorsAreInTheResponsesTermsAtTheSource) {
  struct Case {
    std::string body, param, message_starts;
  };
  const std::vector<Case> cases = {
      {R"({"instructions": "x", "input": [{"role": "user", "content": "a"},
          {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{not json"}]})",
       "input[1].arguments", "input[1].arguments = \"{not json\" is not JSON"},
      {R"({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x"}}})", "text.format.schema",
       "text.format.schema is required"},
      {R"({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": 5}}})",
       "text.format.schema", "text.format.schema must be a JSON schema"},
      {R"({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x",
          "schema": {"type": "integer", "multipleOf": 2}}}})",
       "text.format", "text.format.schema: "},
      {R"({"input": "Hi", "tools": [{"type": "function", "name": "a b"}]})", "tools", "tools[0].name = \"a b\""},
      {R"({"input": "Hi", "tools": [{"type": "function", "name": "f"}, {"type": "function", "name": "f"}]})",
       "tools", "tools[1].name = \"f\" is given twice"},
      {R"({"input": "Hi", "tools": [{"type": "function", "name": "f", "parameters": [1]}]})", "tools",
       "tools[0].parameters = [1]"},
      {R"({"input": "Hi", "tools": [{"type": "function", "name": "f", "parameters": {"type": "integer",
          "multipleOf": 2}}], "tool_choice": {"type": "function", "name": "f"}})",
       "tools", "tools[0].parameters: "},
      {R"({"input": "Hi", "tools": [{"type": "function", "name": "f"}], "tool_choice": "sometimes"})", "tool_choice",
       "tool_choice = \"sometimes\" must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\""},
      {R"({"input": "Hi", "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function",
          "name": "g"}})", "tool_choice", "tool_choice names function \"g\", which is not in tools"},
      {R"({"input": "Hi", "tool_choice": "required"})", "tool_choice", "tool_choice = \"required\" needs tools"},
      {R"({"input": "Hi", "text": {"format": {"type": "json_object"}}, "tools": [{"type": "function", "name": "f"}],
          "tool_choice": "required"})", "tool_choice", "tool_choice \"required\" generates calls"},
      {R"({"input": "Hi", "parallel_tool_calls": 1})", "parallel_tool_calls", "parallel_tool_calls must be a boolean"},
      {R"({"input": "Hi", "timeout_ms": 0})", "timeout_ms", "timeout_ms = 0 must be > 0"},
      {R"({"input": "Hi", "temperature": "hot"})", "temperature", "temperature must be a number"},
  };
  for (const Case& c : cases) {
    const ApiError e = Refusal(c.body);
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_EQ(e.message.rfind(c.message_starts, 0), 0u) << e.message;
    for (const char* chat_term : {"messages", "response_format", "max_tokens", ".function."}) {
      EXPECT_EQ(e.message.find(chat_term), std::string::npos) << e.message;
    }
  }
  // A field the Generator's validation refuses later is named in the Responses terms too.
  const ResponsesRequest r9 = Parse(R"({"input": "Hi", "max_output_tokens": 9})");
  EXPECT_EQ(ErrorFromStatus({StatusCode::kInvalidArgument, "sampling.max_tokens = 9 exceeds lane \"x\"'s cap of 4"},
                            r9.chat.param_name).param,
            "max_output_tokens");
  EXPECT_EQ(ErrorFromStatus({StatusCode::kInvalidArgument, "prompt tokens (5) + sampling.max_tokens (9) = 14 exceeds "
                                                           "max_model_len 8"},
                            r9.chat.param_name).param,
            "input");
  EXPECT_EQ(ErrorFromStatus({StatusCode::kInvalidArgument, "sampling.top_p = 2 must be in (0, 1]"}, r9.chat.param_name)
                .param,
            "top_p");
  const ChatTemplate plain = ChatTemplate::FromTemplateText("{{ raise_exception('no conversation like this') }}");
  auto r = ParseResponsesRequest(json::parse(R"({"input": "Hi"})"), "", plain, nullptr);
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_EQ(std::get<ApiError>(r).param, "input") << "a template that cannot render: the conversation's field";
}

// The Responses request and the chat request it stands for are one typed request: the same prompt,
// sampling, tools and constraint.
TEST(ParseResponses, IsTheChatRequestItStandsFor) {
  const std::string responses = std::string(R"({"instructions": "Be brief.", "input": [
      {"role": "user", "content": "Weather?"},
      {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"},
      {"type": "function_call_output", "call_id": "c1", "output": "sunny"}],
    "max_output_tokens": 9, "temperature": 0.3, "top_p": 0.8, "seed": 7, "parallel_tool_calls": false,
    "tool_choice": "required", "tools": [)") + kWeather + "]}";
  const std::string chat = R"({"messages": [{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
    "max_tokens": 9, "temperature": 0.3, "top_p": 0.8, "seed": 7, "parallel_tool_calls": false,
    "tool_choice": "required", "tools": [{"type": "function", "function": {"name": "get_weather",
      "description": "Weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
      "required": ["city"]}}}]})";
  const ResponsesRequest r = Parse(responses);
  auto c = ParseChatRequest(json::parse(chat), Qwen(), chat);
  ASSERT_TRUE(std::holds_alternative<OpenAiRequest>(c)) << std::get<ApiError>(c).message;
  const OpenAiRequest& expected = std::get<OpenAiRequest>(c);
  EXPECT_EQ(r.chat.generate.SerializeAsString(), expected.generate.SerializeAsString())
      << r.chat.generate.DebugString() << "\n" << expected.generate.DebugString();
  EXPECT_EQ(r.chat.tools.tools, expected.tools.tools);
  EXPECT_EQ(r.chat.tools.named_schema, expected.tools.named_schema);
  EXPECT_EQ(r.chat.is_max_tokens_set, expected.is_max_tokens_set);
}

TEST(ResponsesResult, HermesCallsBecomeFunctionCallItems) {
  ToolsRequest tools;
  tools.tools = {nlohmann::ordered_json::object()};
  tools.names = {"get_weather"};
  tools.choice = ToolsRequest::Choice::kAuto;
  ferry::v1::GenerateResponse g;
  g.set_text("Checking.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>");
  g.set_finish_reason(ferry::v1::FINISH_REASON_STOP);
  g.mutable_usage()->set_prompt_tokens(20);
  g.mutable_usage()->set_completion_tokens(9);
  g.mutable_usage()->set_cached_tokens(16);
  const ResponsesResult r = ResultFromGeneration(g, tools);
  ASSERT_TRUE(r.text.has_value());
  EXPECT_EQ(*r.text, "Checking.");
  ASSERT_EQ(r.calls.size(), 1u);
  const json out = ResponseJson({"resp_1", 5, "m"}, {{"store", true}}, &r);
  EXPECT_EQ(out["status"], "completed");
  EXPECT_EQ(out["object"], "response");
  EXPECT_EQ(out["created_at"], 5);
  ASSERT_EQ(out["output"].size(), 2u);
  EXPECT_EQ(out["output"][0]["type"], "message");
  EXPECT_EQ(out["output"][0]["content"][0]["text"], "Checking.");
  EXPECT_EQ(out["output"][1]["type"], "function_call");
  EXPECT_EQ(out["output"][1]["name"], "get_weather");
  EXPECT_EQ(json::parse(out["output"][1]["arguments"].get<std::string>()), json::parse(R"({"city": "Oslo"})"));
  EXPECT_EQ(out["output"][1]["call_id"], r.calls[0].id);
  EXPECT_EQ(out["usage"]["input_tokens"], 20);
  EXPECT_EQ(out["usage"]["input_tokens_details"]["cached_tokens"], 16);
  EXPECT_EQ(out["usage"]["total_tokens"], 29);
  EXPECT_TRUE(out["store"]);
  // The history a continuation sees: the assistant's turn with its call.
  const std::vector<ChatMessage> h = HistoryAfter({}, r);
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].role, "assistant");
  EXPECT_EQ(h[0].content, "Checking.");
  ASSERT_EQ(h[0].tool_calls.size(), 1u);
  EXPECT_EQ(h[0].tool_calls[0].name, "get_weather");
  EXPECT_EQ(h[0].tool_calls[0].arguments, nlohmann::ordered_json({{"city", "Oslo"}}));
}

TEST(ResponsesResult, ACallCutShortStaysInTheHistoryAsItsText) {
  ToolsRequest tools;
  tools.tools = {nlohmann::ordered_json::object()};
  tools.names = {"get_weather"};
  tools.choice = ToolsRequest::Choice::kNamed;
  tools.named = "get_weather";
  ferry::v1::GenerateResponse g;
  g.set_text(R"({"city": "Os)");
  g.set_finish_reason(ferry::v1::FINISH_REASON_LENGTH);
  const std::vector<ChatMessage> h = HistoryAfter({}, ResultFromGeneration(g, tools));
  ASSERT_EQ(h[0].tool_calls.size(), 1u);
  EXPECT_EQ(h[0].tool_calls[0].arguments, R"({"city": "Os)") << "the text, as a string, for the template's tojson";
  const ResponsesRequest next = Parse(R"({"input": "Go on."})", &h);
  EXPECT_NE(next.chat.generate.text().find(R"({"name": "get_weather", "arguments": "{\"city\": \"Os"})"),
            std::string::npos)
      << next.chat.generate.text();
}

TEST(ResponsesResult, CutByMaxTokensIsIncomplete) {
  ferry::v1::GenerateResponse g;
  g.set_text("partial");
  g.set_finish_reason(ferry::v1::FINISH_REASON_LENGTH);
  const ResponsesResult r = ResultFromGeneration(g, ToolsRequest{});
  const json out = ResponseJson({"resp_1", 5, "m"}, json::object(), &r);
  EXPECT_EQ(out["status"], "incomplete");
  EXPECT_EQ(out["incomplete_details"]["reason"], "max_output_tokens");
}

// Event types of a stream, in order, and the sequence numbers 0, 1, 2, ...
std::vector<std::string> Types(const std::string& events, std::vector<json>* bodies = nullptr) {
  std::vector<std::string> types;
  size_t at = 0;
  int64_t expect = 0;
  while ((at = events.find("event: ", at)) != std::string::npos) {
    const size_t eol = events.find('\n', at);
    types.push_back(events.substr(at + 7, eol - at - 7));
    const size_t data = events.find("data: ", eol);
    const size_t end = events.find("\n\n", data);
    const json body = json::parse(events.substr(data + 6, end - data - 6));
    EXPECT_EQ(body["type"], types.back());
    EXPECT_EQ(body["sequence_number"], expect++);
    if (bodies != nullptr) bodies->push_back(body);
    at = end;
  }
  return types;
}

ferry::v1::GenerateChunk Chunk(const std::string& text, ferry::v1::FinishReason finish = {}) {
  ferry::v1::GenerateChunk c;
  c.set_text(text);
  c.set_finish_reason(finish);
  return c;
}

TEST(ResponsesStream, TextEventsInOpenAisOrderAndTheStoredResponse) {
  json stored;
  ResponsesStreamFormat f({"resp_1", 5, "m"}, {{"store", true}},
                          [&](const json& response, const ResponsesResult&) { stored = response; });
  std::string events = f.Chunk(0, Chunk("Hel"), nullptr, false);
  events += f.Chunk(0, Chunk("lo", ferry::v1::FINISH_REASON_STOP), nullptr, false);
  events += f.End(Status());
  std::vector<json> bodies;
  EXPECT_EQ(Types(events, &bodies),
            (std::vector<std::string>{"response.created", "response.in_progress", "response.output_item.added",
                                      "response.content_part.added", "response.output_text.delta",
                                      "response.output_text.delta", "response.output_text.done",
                                      "response.content_part.done", "response.output_item.done",
                                      "response.completed"}));
  EXPECT_EQ(bodies[0]["response"]["status"], "in_progress");
  EXPECT_EQ(bodies[6]["text"], "Hello");
  EXPECT_EQ(bodies.back()["response"]["output"][0]["content"][0]["text"], "Hello");
  EXPECT_EQ(bodies.back()["response"]["output"][0]["id"], bodies[2]["item"]["id"]);
  EXPECT_EQ(stored, bodies.back()["response"]);
}

TEST(ResponsesStream, ToolCallsAreFunctionCallItemsAndAFailureIsResponseFailed) {
  ResponsesStreamFormat f({"resp_1", 5, "m"}, json::object(), nullptr);
  const json first = json::parse(R"([{"index": 0, "id": "call_9", "type": "function",
                                      "function": {"name": "get_weather", "arguments": "{\"city\""}}])");
  const json more = json::parse(R"([{"index": 0, "function": {"arguments": ": \"Oslo\"}"}}])");
  std::string events = f.Chunk(0, Chunk(""), first, false);
  events += f.Chunk(0, Chunk("", ferry::v1::FINISH_REASON_STOP), more, false);
  events += f.End(Status());
  std::vector<json> bodies;
  EXPECT_EQ(Types(events, &bodies),
            (std::vector<std::string>{"response.created", "response.in_progress", "response.output_item.added",
                                      "response.function_call_arguments.delta",
                                      "response.function_call_arguments.delta",
                                      "response.function_call_arguments.done", "response.output_item.done",
                                      "response.completed"}));
  EXPECT_EQ(bodies[5]["arguments"], "{\"city\": \"Oslo\"}");
  EXPECT_EQ(bodies.back()["response"]["output"][0]["call_id"], "call_9");

  ResponsesStreamFormat failed({"resp_2", 5, "m"}, json::object(), nullptr);
  std::string out = failed.Chunk(0, Chunk("Hi"), nullptr, false);
  out += failed.End(Status(StatusCode::kUnavailable, "workers lost"));
  const std::vector<std::string> types = Types(out, &bodies);
  EXPECT_EQ(types.back(), "response.failed");
  EXPECT_EQ(bodies.back()["response"]["status"], "failed");
  EXPECT_NE(bodies.back()["response"]["error"]["message"].get<std::string>().find("workers lost"), std::string::npos);
}

}  // namespace
}  // namespace ferry::gateway::http
