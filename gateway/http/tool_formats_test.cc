#include "gateway/http/tool_formats.h"

#include <gtest/gtest.h>

#include <regex>

#include "gateway/http/openai_format.h"
#include "gateway/http/tool_calls.h"

namespace ferry::gateway::http {
namespace {

TEST(ToolFormats, NamesAndTemplates) {
  EXPECT_EQ(ToolFormatFromName("llama3_json"), ToolFormat::kLlama3Json);
  EXPECT_EQ(ToolFormatFromName("mistral"), ToolFormat::kMistral);
  EXPECT_EQ(ToolFormatFromName("hermes"), ToolFormat::kHermes);
  EXPECT_FALSE(ToolFormatFromName("pythonic"));
  EXPECT_EQ(ToolFormatOfTemplate("{{ '<tool_call>' }}"), ToolFormat::kHermes);
  EXPECT_EQ(ToolFormatOfTemplate("{{ '[TOOL_CALLS] [' }}"), ToolFormat::kMistral);
  EXPECT_EQ(ToolFormatOfTemplate("<|start_header_id|>{{ '\"parameters\": ' }}"), ToolFormat::kLlama3Json);
  EXPECT_EQ(ToolFormatOfTemplate("{{ messages }}"), ToolFormat::kNone);
  EXPECT_TRUE(std::regex_match(NewToolCallId(ToolFormat::kMistral), std::regex("[A-Za-z0-9]{9}")));
  EXPECT_EQ(NewToolCallId().rfind("chatcmpl-tool-", 0), 0u);
}

TEST(ToolFormats, Llama3JsonIsAllCallsOrNone) {
  ParsedOutput one = ParseLlama3JsonOutput(R"({"name": "f", "parameters": {"x": 1, "s": "a;b}"}})", true);
  ASSERT_EQ(one.calls.size(), 1u);
  EXPECT_FALSE(one.content);
  EXPECT_EQ(one.calls[0].name, "f");
  EXPECT_EQ(one.calls[0].arguments, R"({"x": 1, "s": "a;b}"})");
  ParsedOutput two = ParseLlama3JsonOutput(
      "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}; {\"name\": \"g\", \"arguments\": {\"y\": [2]}}", true);
  ASSERT_EQ(two.calls.size(), 2u);
  EXPECT_EQ(two.calls[1].arguments, R"({"y": [2]})");
  EXPECT_EQ(ParseLlama3JsonOutput(two.calls.empty() ? "" : "{\"name\": \"f\", \"parameters\": {}}; {\"name\": \"g\", "
                                                          "\"parameters\": {}}",
                                  false)
                .calls.size(),
            1u);
  for (const char* text : {"Hello {\"name\": \"f\", \"parameters\": {}}", "{\"name\": \"f\"}", "{\"name\": 3, "
                           "\"parameters\": {}}", "{\"name\": \"f\", \"parameters\": {}} and text", "{\"name\": \"f\""}) {
    ParsedOutput p = ParseLlama3JsonOutput(text, true);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text) << "not calls: the whole text is content";
  }
}

TEST(ToolFormats, MistralCallsFollowTheirToken) {
  ParsedOutput p = ParseMistralOutput(
      "Checking. [TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"x\": 1}}, {\"name\": \"g\", \"arguments\": {}}]", true);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.content, "Checking. ");
  EXPECT_EQ(p.calls[0].arguments, R"({"x": 1})");
  EXPECT_EQ(p.calls[0].id.size(), 9u);
  EXPECT_EQ(ParseMistralOutput("[TOOL_CALLS] {\"name\": \"f\", \"arguments\": {}}", true).calls.size(), 1u)
      << "one object, unwrapped";
  EXPECT_FALSE(ParseMistralOutput("[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}]", true).content);
  const std::string broken = "Sure [TOOL_CALLS] [{\"name\": \"f\"";
  EXPECT_EQ(ParseMistralOutput(broken, true).content, broken);
  EXPECT_EQ(ParseMistralOutput("no calls", true).content, "no calls");
}

// A streamed choice, cut at every byte: the same content and calls as the whole text.
void ExpectStreamMatchesWhole(ToolFormat format, const std::string& text) {
  ToolsRequest tools;
  tools.choice = ToolsRequest::Choice::kAuto;
  tools.format = format;
  const ParsedOutput whole = ParseChoiceOutput(tools, text);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    StreamToolCalls stream(ToolsRequest::Choice::kAuto, "", true, format);
    std::string content;
    std::vector<std::pair<std::string, std::string>> calls;
    for (const StreamDelta& d : {stream.Feed(text.substr(0, cut)), stream.Feed(text.substr(cut)), stream.Finish()}) {
      content += d.content;
      if (d.tool_calls.is_null()) continue;
      for (const auto& c : d.tool_calls) calls.emplace_back(c["function"]["name"], c["function"]["arguments"]);
    }
    EXPECT_EQ(content, whole.content.value_or("")) << text << " cut at " << cut;
    ASSERT_EQ(calls.size(), whole.calls.size()) << text << " cut at " << cut;
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(calls[i].first, whole.calls[i].name);
      EXPECT_EQ(calls[i].second, whole.calls[i].arguments);
    }
    EXPECT_EQ(stream.called(), !whole.calls.empty());
  }
}

TEST(ToolFormats, StreamedAsWhole) {
  ExpectStreamMatchesWhole(ToolFormat::kLlama3Json, "  {\"name\": \"f\", \"parameters\": {\"x\": \"é\"}}");
  ExpectStreamMatchesWhole(ToolFormat::kLlama3Json, "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}");
  ExpectStreamMatchesWhole(ToolFormat::kLlama3Json, "Plain answer, {not a call}.");
  ExpectStreamMatchesWhole(ToolFormat::kLlama3Json, "{\"broken\": ");
  ExpectStreamMatchesWhole(ToolFormat::kLlama3Json, "<|python_ta");
  ExpectStreamMatchesWhole(ToolFormat::kMistral, "Let me see. [TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"a\": 1}}]");
  ExpectStreamMatchesWhole(ToolFormat::kMistral, "An answer with [TOOL but no calls");
  ExpectStreamMatchesWhole(ToolFormat::kMistral, "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}}, "
                                                 "{\"name\": \"g\", \"arguments\": {\"b\": [1]}}]");
}

TEST(ToolFormats, AutoNeedsAKnownFormat) {
  ToolsSpec spec;
  ToolSpec tool;
  tool.name = "f";
  tool.field = "tools[0].function";
  spec.tools.push_back(tool);
  auto refused = BuildTools(spec, true, ToolFormat::kNone);
  ASSERT_TRUE(std::holds_alternative<ApiError>(refused));
  EXPECT_EQ(std::get<ApiError>(refused).param, "tool_choice");
  EXPECT_NE(std::get<ApiError>(refused).message.find("--tool-call-parser"), std::string::npos);
  spec.choice = ToolsRequest::Choice::kRequired;
  EXPECT_TRUE(std::holds_alternative<ToolsRequest>(BuildTools(spec, true, ToolFormat::kNone)))
      << "required and named calls are generated under a schema: no parser needed";
}

}  // namespace
}  // namespace ferry::gateway::http
