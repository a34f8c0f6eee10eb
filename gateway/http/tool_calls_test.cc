// Tools on the chat endpoint: the request's tools and tool_choice, the prompt Qwen2.5's template
// renders with them, the calls a whole text and a stream hold, and the response's shape.
#include "gateway/http/tool_calls.h"

#include <gtest/gtest.h>

#include <random>

#include "gateway/http/openai_format.h"
#include "gateway/tokenizer/bpe_trainer.h"

namespace ferry::gateway::http {
namespace {

using ordered_json = nlohmann::ordered_json;

const char* kWeatherTool = R"({"type": "function", "function": {"name": "get_weather",
  "description": "Weather in a city", "parameters": {"type": "object",
  "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}})";

ordered_json Body(const std::string& tools_json, const ordered_json& choice = ordered_json()) {
  ordered_json body = {{"messages", ordered_json::array({{{"role", "user"}, {"content", "Hi"}}})}};
  body["tools"] = ordered_json::parse(tools_json);
  if (!choice.is_null()) body["tool_choice"] = choice;
  return body;
}

ApiError ToolsError(const ordered_json& body, bool template_has_tools = true) {
  auto r = ParseTools(body, template_has_tools);
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{0, "parsed"};
}

TEST(PyJsonDumps, WritesWhatPythonsJsonDumpsWrites) {
  // json.dumps(..., ensure_ascii=False) of the same values, keys in their order.
  EXPECT_EQ(PyJsonDumps(ordered_json::parse(R"({"b": [1, 2.5, "x"], "a": {"d": null, "e": true}, "c": []})")),
            R"({"b": [1, 2.5, "x"], "a": {"d": null, "e": true}, "c": []})");
  EXPECT_EQ(PyJsonDumps(ordered_json::parse(R"({"k": "caf\u00e9 \u4f60 \n \u0001 \" \\ /"})")),
            "{\"k\": \"caf\xC3\xA9 \xE4\xBD\xA0 \\n \\u0001 \\\" \\\\ /\"}");
  EXPECT_EQ(PyJsonDumps(ordered_json::parse("{}")), "{}");
  EXPECT_EQ(PyJsonDumps(ordered_json::parse("-3")), "-3");
}

TEST(ParseTools, ReadsToolsInTheirOrderAndTheChoice) {
  auto r = ParseTools(Body(std::string("[") + kWeatherTool + "]"), true);
  ASSERT_TRUE(std::holds_alternative<ToolsRequest>(r)) << std::get<ApiError>(r).message;
  const ToolsRequest& t = std::get<ToolsRequest>(r);
  ASSERT_EQ(t.tools.size(), 1u);
  EXPECT_EQ(PyJsonDumps(t.tools[0]), R"({"type": "function", "function": {"name": "get_weather", "description": "Weather in a )"
                           R"(city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, )"
                           R"("unit": {"enum": ["c", "f"]}}, "required": ["city"]}}})");
  EXPECT_EQ(t.choice, ToolsRequest::Choice::kAuto) << "auto is the default with tools";
  EXPECT_TRUE(t.parallel);

  auto named = ParseTools(Body(std::string("[") + kWeatherTool + "]",
                               {{"type", "function"}, {"function", {{"name", "get_weather"}}}}), true);
  ASSERT_TRUE(std::holds_alternative<ToolsRequest>(named));
  EXPECT_EQ(std::get<ToolsRequest>(named).choice, ToolsRequest::Choice::kNamed);
  EXPECT_EQ(std::get<ToolsRequest>(named).named_schema,
            R"({"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["c","f"]}},"required":["city"]})")
      << "the schema keeps the request's key order: properties are generated in it";
  auto none = ParseTools(Body(std::string("[") + kWeatherTool + "]", "none"), true);
  EXPECT_EQ(std::get<ToolsRequest>(none).choice, ToolsRequest::Choice::kNone);
  EXPECT_TRUE(std::get<ToolsRequest>(none).active()) << "tools are rendered with tool_choice none";
  auto no_tools = ParseTools(ordered_json{{"tool_choice", "none"}}, true);
  EXPECT_FALSE(std::get<ToolsRequest>(no_tools).active());
}

TEST(ParseTools, RefusesWhatItCannotServeNamingTheField) {
  const std::string one = std::string("[") + kWeatherTool + "]";
  struct Case {
    ordered_json body;
    std::string param, says;
  };
  ordered_json parallel = Body(one);
  parallel["parallel_tool_calls"] = "yes";
  const std::vector<Case> cases = {
      {Body(R"({"type": "function"})"), "tools", "must be a list"},
      {Body(R"([{"type": "function"}])"), "tools", "tools[0] = "},
      {Body(R"([{"type": "code", "function": {"name": "f"}}])"), "tools", "tools[0] = "},
      {Body(R"([{"type": "function", "function": {"name": "a b"}}])"), "tools", "tools[0].function.name = \"a b\""},
      {Body(R"([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}])"),
       "tools", "tools[1].function.name = \"f\" is given twice"},
      {Body(R"([{"type": "function", "function": {"name": "f", "parameters": [1]}}])"), "tools",
       "tools[0].function.parameters"},
      {Body(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "integer", "multipleOf": 2}}}])",
            {{"type", "function"}, {"function", {{"name", "f"}}}}),
       "tools", "multipleOf"},
      {Body(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "integer", "multipleOf": 2}}}])",
            "required"),
       "tools", "tool_choice \"required\" generates"},
      {Body(one, "sometimes"), "tool_choice", "must be \"none\", \"auto\" or"},
      {Body(one, {{"type", "function"}, {"function", {{"name", "get_time"}}}}), "tool_choice",
       "\"get_time\", which is not in tools"},
      {parallel, "parallel_tool_calls", "must be a boolean"},
      {ordered_json{{"tool_choice", "required"}}, "tool_choice", "needs tools"},
  };
  for (const Case& c : cases) {
    const ApiError e = ToolsError(c.body);
    EXPECT_EQ(e.http_status, 400) << c.body.dump();
    EXPECT_EQ(e.param, c.param) << c.body.dump();
    EXPECT_NE(e.message.find(c.says), std::string::npos) << e.message;
  }
  const ApiError no_template = ToolsError(Body(one), /*template_has_tools=*/false);
  EXPECT_EQ(no_template.param, "tools");
  EXPECT_NE(no_template.message.find("chat template does not render tools"), std::string::npos);
}

TEST(RequiredToolChoice, IsAnArrayOfCallsToldApartByName) {
  const std::string two = std::string("[") + kWeatherTool + R"(, {"type": "function", "function": {"name": "now"}}])";
  auto r = ParseTools(Body(two, "required"), true);
  ASSERT_TRUE(std::holds_alternative<ToolsRequest>(r)) << std::get<ApiError>(r).message;
  EXPECT_EQ(std::get<ToolsRequest>(r).choice, ToolsRequest::Choice::kRequired);
  EXPECT_EQ(std::get<ToolsRequest>(r).named_schema,
            R"({"type":"array","minItems":1,"items":{"anyOf":[{"type":"object","properties":{"name":{"enum":)"
            R"(["get_weather"]},"parameters":{"type":"object","properties":{"city":{"type":"string"},"unit":)"
            R"({"enum":["c","f"]}},"required":["city"]}},"required":["name","parameters"],"additionalProperties":)"
            R"(false},{"type":"object","properties":{"name":{"enum":["now"]},"parameters":{"type":"object"}},)"
            R"("required":["name","parameters"],"additionalProperties":false}]}})");
  ordered_json single = Body(two, "required");
  single["parallel_tool_calls"] = false;
  EXPECT_NE(std::get<ToolsRequest>(ParseTools(single, true)).named_schema.find("\"maxItems\":1"), std::string::npos);

  const std::string text = R"([{"name": "get_weather", "parameters": {"city": "a}\"{"}}, {"name": "now", "parameters": {}}])";
  const ParsedOutput whole = RequiredOutput(text);
  ASSERT_EQ(whole.calls.size(), 2u);
  EXPECT_FALSE(whole.content.has_value());
  EXPECT_EQ(whole.calls[0].arguments, R"({"city": "a}\"{"})");
  EXPECT_EQ(whole.calls[1].name, "now");
  EXPECT_EQ(RequiredOutput("[{\"name\": \"now\"").content, "[{\"name\": \"now\"") << "cut short: content";
  for (size_t cut = 1; cut <= text.size(); ++cut) {
    StreamToolCalls parser(ToolsRequest::Choice::kRequired, "", true);
    nlohmann::json calls = nlohmann::json::array();
    for (size_t at = 0; at < text.size(); at += cut) {
      StreamDelta d = parser.Feed(text.substr(at, cut));
      EXPECT_TRUE(d.content.empty());
      for (auto& c : d.tool_calls) calls.push_back(c);
    }
    ASSERT_EQ(calls.size(), 2u) << "cut " << cut;
    EXPECT_EQ(calls[0]["function"]["arguments"], whole.calls[0].arguments) << "cut " << cut;
    EXPECT_EQ(calls[1]["index"], 1);
    EXPECT_TRUE(parser.called());
  }
}

TEST(ParseHermesOutput, TakesTheCallsAndTheTextBeforeThem) {
  const std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"n\": 2}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  ParsedOutput out = ParseHermesOutput(text, true);
  ASSERT_EQ(out.calls.size(), 2u);
  EXPECT_EQ(out.content, "Let me check.\n");
  EXPECT_EQ(out.calls[0].name, "get_weather");
  EXPECT_EQ(out.calls[0].arguments, R"({"city": "Paris", "n": 2})");
  EXPECT_EQ(out.calls[1].arguments, "{}");
  EXPECT_NE(out.calls[0].id, out.calls[1].id);
  EXPECT_EQ(out.calls[0].id.rfind("chatcmpl-tool-", 0), 0u);
  EXPECT_EQ(ParseHermesOutput(text, /*parallel=*/false).calls.size(), 1u);

  ParsedOutput only = ParseHermesOutput("<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}", true);
  ASSERT_EQ(only.calls.size(), 1u) << "an unclosed last block still counts, as in vLLM's parser";
  EXPECT_FALSE(only.content.has_value()) << "no text before the call: content null";
  for (const std::string& not_calls : {std::string("plain text"), std::string("<tool_call>{not json}</tool_call>"),
                                       std::string("<tool_call>{\"name\": \"f\"}</tool_call>")}) {
    ParsedOutput p = ParseHermesOutput(not_calls, true);
    EXPECT_TRUE(p.calls.empty()) << not_calls;
    EXPECT_EQ(p.content, not_calls) << "the whole text stays content";
  }
}

// The calls a stream sends, joined: what the whole text's parse gives, wherever the chunks cut.
TEST(StreamToolCalls, ChunksCutAnywhereGiveTheWholeTextsCalls) {
  const std::string text =
      "Sure.<tool_call>\n{\"name\": \"a\", \"arguments\": {\"q\": \"<tool\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"b\", \"arguments\": [1]}\n</tool_call>";
  const ParsedOutput whole = ParseHermesOutput(text, true);
  ASSERT_EQ(whole.calls.size(), 2u);
  for (size_t cut = 1; cut <= text.size(); cut += 3) {
    StreamToolCalls parser(ToolsRequest::Choice::kAuto, "", true);
    std::string content;
    nlohmann::json calls = nlohmann::json::array();
    for (size_t at = 0; at < text.size(); at += cut) {
      StreamDelta d = parser.Feed(text.substr(at, cut));
      content += d.content;
      for (auto& c : d.tool_calls) calls.push_back(c);
    }
    StreamDelta end = parser.Finish();
    content += end.content;
    for (auto& c : end.tool_calls) calls.push_back(c);
    EXPECT_EQ(content, *whole.content) << "cut " << cut;
    ASSERT_EQ(calls.size(), 2u) << "cut " << cut;
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(calls[i]["index"], i);
      EXPECT_EQ(calls[i]["function"]["name"], whole.calls[i].name);
      EXPECT_EQ(calls[i]["function"]["arguments"], whole.calls[i].arguments);
    }
    EXPECT_TRUE(parser.called());
  }
}

// Random texts of calls, text and tag fragments, cut at random: wherever the whole text's calls
// all parse, the stream sends the same content and the same calls.
TEST(StreamToolCalls, RandomTextsAndCutsAgreeWithTheWholeParse) {
  std::mt19937 rng(17);
  const std::vector<std::string> pieces = {
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"</tool\"}}\n</tool_call>",
      "<tool_call>{\"name\": \"g\", \"arguments\": [1, {\"b\": null}]}</tool_call>",
      "plain", " <", "<tool", "_call", "\n", "caf\xC3\xA9", "</tool_call>", "<tool_call>"};
  int compared = 0;
  for (int run = 0; run < 3000; ++run) {
    std::string text;
    for (unsigned n = 1 + rng() % 6; n-- > 0;) text += pieces[rng() % pieces.size()];
    const ParsedOutput whole = ParseHermesOutput(text, true);
    if (text.find("<tool_call>") != std::string::npos && whole.calls.empty()) continue;  // the whole stays text
    StreamToolCalls parser(ToolsRequest::Choice::kAuto, "", true);
    std::string content;
    std::vector<std::pair<std::string, std::string>> calls;
    auto take = [&](StreamDelta d) {
      content += d.content;
      for (auto& c : d.tool_calls) calls.emplace_back(c["function"]["name"], c["function"]["arguments"]);
    };
    for (size_t at = 0; at < text.size();) {
      const size_t cut = 1 + rng() % 9;
      take(parser.Feed(text.substr(at, cut)));
      at += cut;
    }
    take(parser.Finish());
    ASSERT_EQ(content, whole.content.value_or("")) << text;
    ASSERT_EQ(calls.size(), whole.calls.size()) << text;
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(calls[i].first, whole.calls[i].name) << text;
      EXPECT_EQ(calls[i].second, whole.calls[i].arguments) << text;
    }
    ++compared;
  }
  EXPECT_GT(compared, 1000);
}

TEST(StreamToolCalls, HoldsOnlyWhatMayBeATagAndNamedCallsStreamTheirArguments) {
  StreamToolCalls text(ToolsRequest::Choice::kAuto, "", true);
  EXPECT_EQ(text.Feed("a < b <tool").content, "a < b ") << "'<tool' may begin a call: held";
  EXPECT_EQ(text.Feed("box").content, "<toolbox");
  EXPECT_EQ(text.Finish().content, "");
  EXPECT_FALSE(text.called());

  StreamToolCalls named(ToolsRequest::Choice::kNamed, "get_weather", true);
  StreamDelta first = named.Feed("{\"city\"");
  ASSERT_TRUE(first.tool_calls.is_array());
  EXPECT_EQ(first.tool_calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(first.tool_calls[0]["function"]["arguments"], "{\"city\"");
  EXPECT_TRUE(first.tool_calls[0].contains("id"));
  StreamDelta next = named.Feed(": \"Oslo\"}");
  EXPECT_FALSE(next.tool_calls[0].contains("id")) << "the id and name go with the first delta only";
  EXPECT_EQ(next.tool_calls[0]["function"]["arguments"], ": \"Oslo\"}");
  EXPECT_TRUE(first.content.empty() && next.content.empty());
  EXPECT_FALSE(named.called()) << "a named call finishes with its own reason, as vLLM";
}

TEST(ChatTools, RendersToolsCallsAndResultsAsQwensTemplate) {
  const ChatTemplate qwen = ChatTemplate::FromTemplateText(std::string(tokenizer::Qwen25ChatTemplate()));
  ASSERT_TRUE(qwen.has_tools());
  const std::vector<ChatMessage> messages = {
      {"user", "Weather?", {}, ""},
      {"assistant", "", {{"c1", "get_weather", {{"city", "Paris"}}}, {"c2", "get_time", nlohmann::ordered_json::object()}}, ""},
      {"tool", "18C", {}, "c1"},
      {"tool", "noon", {}, "c2"},
      {"assistant", "Nice.", {}, ""}};
  const std::string expected =
      "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\n"
      "You may call one or more functions to assist with the user query.\n\nYou are provided with function "
      "signatures within <tools></tools> XML tags:\n<tools>\n{\"t\": 1}\n</tools>\n\nFor each function call, return "
      "a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
      "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\nWeather?<|im_end|>\n"
      "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n<tool_response>\nnoon\n</tool_response><|im_end|>\n"
      "<|im_start|>assistant\nNice.<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(std::get<std::string>(qwen.Render(messages, {{{"t", 1}}})), expected);
  EXPECT_FALSE(ChatTemplate::FromTemplateText("<|im_start|> no tool variable here").has_tools());
}

TEST(ChatTools, ParsesHistoryAndSetsANamedCallsSchema) {
  const ChatTemplate qwen = ChatTemplate::FromTemplateText(std::string(tokenizer::Qwen25ChatTemplate()));
  const std::string body_text = std::string(R"({"messages": [{"role": "user", "content": "Hi"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
       "function": {"name": "get_weather", "arguments": "{\"z\": 1, \"a\": [true]}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    "tools": [)") + kWeatherTool + "]}";
  const json body = json::parse(body_text);
  auto parsed = ParseChatRequest(body, qwen, body_text);
  ASSERT_TRUE(std::holds_alternative<OpenAiRequest>(parsed)) << std::get<ApiError>(parsed).message;
  const OpenAiRequest& r = std::get<OpenAiRequest>(parsed);
  EXPECT_NE(r.generate.text().find("\"arguments\": {\"z\": 1, \"a\": [true]}}"), std::string::npos)
      << "history arguments are parsed and written as JSON in their order";
  EXPECT_NE(r.generate.text().find("<tool_response>\nsunny\n</tool_response>"), std::string::npos);
  EXPECT_EQ(r.generate.sampling().guided().json_schema(), r.tools.named_schema);

  json conflict = body;
  conflict["response_format"] = {{"type", "json_object"}};
  auto refused = ParseChatRequest(conflict, qwen, conflict.dump());
  ASSERT_TRUE(std::holds_alternative<ApiError>(refused));
  EXPECT_EQ(std::get<ApiError>(refused).param, "tool_choice");
  json bad_history = body;
  bad_history["messages"][1]["tool_calls"][0]["function"]["arguments"] = "{oops";
  refused = ParseChatRequest(bad_history, qwen, bad_history.dump());
  ASSERT_TRUE(std::holds_alternative<ApiError>(refused));
  EXPECT_NE(std::get<ApiError>(refused).message.find("messages[1].tool_calls[0].function.arguments"),
            std::string::npos);
  auto completions = ParseCompletionRequest({{"prompt", "x"}, {"tools", json::parse(std::string("[") + kWeatherTool + "]")}});
  ASSERT_TRUE(std::holds_alternative<ApiError>(completions));
  EXPECT_EQ(std::get<ApiError>(completions).param, "tools");
}

TEST(ChatTools, ResponsesCarryTheCalls) {
  ResponseContext ctx{Endpoint::kChat, "chatcmpl-1", 1, "m"};
  ferry::v1::GenerateResponse response;
  response.set_text("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>");
  response.set_finish_reason(ferry::v1::FINISH_REASON_EOS);
  ToolsRequest tools;
  tools.tools = {ordered_json::object()};
  tools.choice = ToolsRequest::Choice::kAuto;
  json out = CompletionResponseJson(ctx, {response}, 1, &tools);
  const json& choice = out["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["arguments"], R"({"city": "Oslo"})");
  EXPECT_EQ(choice["message"]["tool_calls"][0]["type"], "function");

  tools.choice = ToolsRequest::Choice::kNamed;
  tools.named = "get_weather";
  response.set_text(R"({"city": "Oslo"})");
  out = CompletionResponseJson(ctx, {response}, 1, &tools);
  EXPECT_EQ(out["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(out["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(out["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], R"({"city": "Oslo"})");

  tools.choice = ToolsRequest::Choice::kNone;
  response.set_text("<tool_call>x</tool_call>");
  out = CompletionResponseJson(ctx, {response}, 1, &tools);
  EXPECT_EQ(out["choices"][0]["message"]["content"], "<tool_call>x</tool_call>") << "none: nothing is parsed";
  EXPECT_FALSE(out["choices"][0]["message"].contains("tool_calls"));

  // A streamed chunk with a call: delta.tool_calls, and the finish says tool_calls.
  StreamState state;
  state.tool_calls = json::array({{{"index", 0}, {"function", {{"arguments", "{}"}}}}});
  state.tools_called = true;
  ferry::v1::GenerateChunk chunk;
  chunk.set_finish_reason(ferry::v1::FINISH_REASON_EOS);
  const std::string event = StreamChunkEvent(ctx, chunk, state);
  const json sent = json::parse(event.substr(6));
  EXPECT_EQ(sent["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
  EXPECT_EQ(sent["choices"][0]["finish_reason"], "tool_calls");
}

}  // namespace
}  // namespace ferry::gateway::http
