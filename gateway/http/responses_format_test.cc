// The Responses API translation (responses_format.h) and its store (response_store.h), without
// sockets. End to end, with the official openai client: tests/python/test_openai_responses.py.
#include "gateway/http/responses_format.h"

#include <gtest/gtest.h>

#include "gateway/http/response_store.h"

namespace ferry::gateway::http {
namespace {

const ChatTemplate& Qwen() {
  static const ChatTemplate t = ChatTemplate::FromTemplateText(
      "<|im_start|> You are Qwen, created by Alibaba Cloud. You are a helpful assistant. <tool_call>");
  return t;
}

constexpr const char* kWeather =
    R"({"type": "function", "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}})";

ResponsesRequest Parse(const std::string& text, const json* previous = nullptr) {
  auto r = ParseResponsesRequest(json::parse(text), text, Qwen(), previous);
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << e->param << ": " << e->message;
  return std::holds_alternative<ResponsesRequest>(r) ? std::get<ResponsesRequest>(r) : ResponsesRequest{};
}

ApiError Refusal(const std::string& text, const json* previous = nullptr) {
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
  EXPECT_EQ(r.history, json::parse(R"([{"role": "user", "content": "Hi"}])"));
  EXPECT_EQ(r.echo["instructions"], "Be brief.");
  EXPECT_EQ(r.echo["metadata"], json::parse(R"({"k": "v"})"));
  EXPECT_EQ(r.echo["tool_choice"], "auto");
}

TEST(ParseResponses, ItemsToolsAndPreviousHistory) {
  const json previous = json::parse(R"([{"role": "user", "content": "Weather in Oslo?"}])");
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
  EXPECT_EQ(r.history[1]["tool_calls"][0]["id"], "call_1");
  EXPECT_EQ(r.history[3]["role"], "system");
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
  // Chat's own checks, in the Responses request's terms: messages[k] is input[k] (after the
  // instructions), response_format is text.format.
  const ApiError args = Refusal(R"({"instructions": "x", "input": [{"role": "user", "content": "a"},
      {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{not json"}]})");
  EXPECT_EQ(args.message.rfind("input[1].tool_calls[0]", 0), 0u) << args.message;
  const ApiError schema = Refusal(R"({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x"}}})");
  EXPECT_EQ(schema.param.rfind("text.format", 0), 0u) << schema.param << ": " << schema.message;
  EXPECT_EQ(schema.message.find("response_format"), std::string::npos) << schema.message;
}

TEST(ResponsesResult, HermesCallsBecomeFunctionCallItems) {
  ToolsRequest tools;
  tools.rendered = {"{}"};
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
  const json h = HistoryAfter(json::array(), r);
  EXPECT_EQ(h[0]["tool_calls"][0]["id"], r.calls[0].id);
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

TEST(ResponseStore, BoundedByCountBytesAndTimeAndPerTenant) {
  using namespace std::chrono_literals;
  ResponseStore store({2, 1 << 20, 10s});
  const auto t0 = ResponseStore::Clock::now();
  store.Put("a", "t1", {{{"id", "a"}}, json::array()}, t0);
  store.Put("b", "t1", {{{"id", "b"}}, json::array()}, t0 + 1s);
  EXPECT_FALSE(store.Get("a", "t2", t0 + 2s).has_value()) << "another tenant's";
  store.Put("c", "t1", {{{"id", "c"}}, json::array()}, t0 + 2s);
  EXPECT_FALSE(store.Get("a", "t1", t0 + 2s).has_value()) << "the oldest went first";
  EXPECT_EQ(store.Get("b", "t1", t0 + 2s)->response["id"], "b");
  EXPECT_TRUE(store.Delete("b", "t1", t0 + 3s));
  EXPECT_FALSE(store.Delete("b", "t1", t0 + 3s));
  EXPECT_FALSE(store.Get("c", "t1", t0 + 12s).has_value()) << "past the retention";
  EXPECT_EQ(store.size(), 0u);
  ResponseStore small({10, 64, 10s});
  small.Put("big", "", {{{"text", std::string(100, 'x')}}, json::array()}, t0);
  EXPECT_FALSE(small.Get("big", "", t0).has_value()) << "larger than the store: never kept";
}

}  // namespace
}  // namespace ferry::gateway::http
