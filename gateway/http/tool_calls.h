// OpenAI tools (function calling) on /v1/chat/completions: the request's tools go to the model's
// chat template (chat_template.h), which renders them with past calls and results; the model
// answers a call in its family's format (tool_formats.h: hermes <tool_call> blocks, Llama 3's
// JSON, Mistral's [TOOL_CALLS]). Plain functions and per-stream state on JSON: no sockets,
// testable alone.
//
// tool_choice, as vLLM's OpenAI server (with --tool-call-parser) serves it:
// - "auto" (the default with tools): the text is generated freely and parsed in the model's
//   format: its calls become message.tool_calls (the text before them is the content),
//   finish_reason "tool_calls". Text that is not calls in that format stays content, as vLLM's
//   parsers leave it. With no known format, "auto" is refused (BuildTools).
// - {"type": "function", "function": {"name": N}}: the output is N's arguments, generated under
//   its `parameters` schema (structured output), and returned as one call of N.
// - "required": as vLLM, the output is a JSON array of at least one {"name": N, "parameters": {...}},
//   generated under the union of the tools' schemas (a tagged union, structured/json_schema.h), each
//   item one call; finish_reason "tool_calls".
// - "none": the tools are in the prompt, nothing is parsed.
// parallel_tool_calls = false keeps only the first call (with "required": an array of one).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "gateway/http/tool_formats.h"

namespace ferry::gateway::http {

struct ApiError;
struct ChatMessage;

// Python's json.dumps(value, ensure_ascii=False): ", " and ": " between items, keys in the
// value's order, non-ASCII as is. What the chat template's `tojson` (transformers') writes.
std::string PyJsonDumps(const nlohmann::ordered_json& value);

struct ToolsRequest {
  enum class Choice { kNone, kAuto, kNamed, kRequired };
  // Each tool as the chat template receives it (the request's object, keys in the client's
  // order), in the request's order.
  std::vector<nlohmann::ordered_json> tools;
  std::vector<std::string> names;
  Choice choice = Choice::kNone;
  std::string named;            // kNamed: the function
  std::string named_schema;     // kNamed: its parameters' JSON text (keys in the request's order);
                                // kRequired: the array of calls' schema
  bool parallel = true;         // parallel_tool_calls
  ToolFormat format = ToolFormat::kHermes;  // how tool_choice "auto" output is parsed (tool_formats.h)
  bool active() const { return !tools.empty(); }
};

// One tool a request offers, read from its API's form: chat's {"type": "function", "function":
// {"name", "description", "parameters"}} or the Responses API's {"type": "function", "name", ...}.
struct ToolSpec {
  std::string field;  // the function's place in the request, in its API's terms: "tools[2].function", "tools[2]"
  std::string name;
  nlohmann::ordered_json parameters;  // its JSON schema, keys in the client's order; null: none (any object)
  nlohmann::ordered_json tool;        // the tool as the chat template receives it
};

// What a request says of tools, on domain types, whichever API it came from. BuildTools checks
// it and makes the ToolsRequest.
struct ToolsSpec {
  std::vector<ToolSpec> tools;
  ToolsRequest::Choice choice = ToolsRequest::Choice::kAuto;  // the default, with tools or without
  std::string named;        // kNamed: the function
  std::string choice_text;  // tool_choice as the client wrote it (cut), for an error
  bool parallel = true;     // parallel_tool_calls
};

// A function's name, description and parameters from `f` (the object that holds them), `field`
// naming it in the request's terms; the caller sets `tool`.
std::variant<ToolSpec, ApiError> ReadToolFunction(const nlohmann::ordered_json& f, const std::string& field);

// Chat's body.tools, tool_choice and parallel_tool_calls; `ordered` is the body parsed keeping
// key order (tools are rendered, and schemas generated, in the client's order).
std::variant<ToolsSpec, ApiError> ReadChatTools(const nlohmann::ordered_json& ordered);

// The checks every API shares (the tool count, unique names, a choice that needs tools, a choice's
// schema as the worker will compile it) and the ToolsRequest. template_has_tools: the chat
// template renders tools (else tools are a 400 naming the template).
// format: how the model answers tool_choice "auto" (kNone: not known, and "auto" is refused).
std::variant<ToolsRequest, ApiError> BuildTools(const ToolsSpec& spec, bool template_has_tools,
                                                ToolFormat format = ToolFormat::kHermes);

// ReadChatTools then BuildTools.
std::variant<ToolsRequest, ApiError> ParseTools(const nlohmann::ordered_json& ordered, bool template_has_tools,
                                                ToolFormat format = ToolFormat::kHermes);

// A call's arguments as the chat template receives them: the JSON text parsed, so that the
// template writes JSON rather than a quoted string (vLLM's rule); nullopt when it is not JSON.
std::optional<nlohmann::ordered_json> TemplateArguments(const std::string& json_text);

// An assistant message's tool_calls in the history (messages[i].tool_calls, `where` naming it):
// [{"id", "type": "function", "function": {"name", "arguments"}}], arguments a JSON text (OpenAI's)
// or a JSON value. As vLLM, the text is parsed, so that the template writes the arguments as
// JSON rather than as a quoted string. Appends to out.tool_calls.
std::optional<ApiError> ParseHistoryToolCalls(const nlohmann::json& calls, const std::string& where, ChatMessage& out);

// tool_choice "auto" in the hermes format: the <tool_call> blocks of `text`.
ParsedOutput ParseHermesOutput(const std::string& text, bool parallel);
// A named tool choice: the text is the function's arguments.
ParsedOutput NamedCallOutput(const std::string& name, const std::string& text, ToolFormat format = ToolFormat::kHermes);
// tool_choice "required": the text is a JSON array of {"name", "parameters"}; a text that is not
// (cut short by max_tokens) stays content.
ParsedOutput RequiredOutput(const std::string& text, ToolFormat format = ToolFormat::kHermes);
// What a choice's whole text says under the request's tools: the named call, the required
// array, or "auto" parsed in the request's format.
ParsedOutput ParseChoiceOutput(const ToolsRequest& tools, const std::string& text);

// One chunk's share of a streamed choice: the content to send (possibly less than the chunk's
// text: a possible "<tool_call>" is held back until it is told apart) and the calls it completes,
// as OpenAI's delta.tool_calls entries.
struct StreamDelta {
  std::string content;
  nlohmann::json tool_calls;  // null or an array
};

// A streamed choice's tool-call parsing, fed its chunks' texts in order.
class StreamToolCalls {
 public:
  StreamToolCalls(ToolsRequest::Choice choice, std::string named, bool parallel, ToolFormat format = ToolFormat::kHermes);
  StreamDelta Feed(const std::string& text);
  // The end of the choice: what was held back.
  StreamDelta Finish();
  // tool_choice "auto" or "required" and a call went out: the finish_reason is "tool_calls".
  bool called() const { return calls_ > 0 && choice_ != ToolsRequest::Choice::kNamed; }

 private:
  void TakeCall(const std::string& block, bool closed, StreamDelta& out);
  void FeedRequired(const std::string& text, StreamDelta& out);

  void SendCalls(const std::vector<ToolCall>& calls, StreamDelta& out);

  const ToolsRequest::Choice choice_;
  const std::string named_;
  const bool parallel_;
  const ToolFormat format_;
  std::optional<HeldToolCalls> held_calls_;  // auto in llama3_json or mistral
  std::string held_;        // auto: text not yet sent (a possible tag, or a call's body)
  bool in_call_ = false;    // auto: held_ is inside <tool_call>
  bool past_first_ = false; // auto: a <tool_call> was seen; later plain text is not content
  int32_t calls_ = 0;
  std::string named_id_;    // named: the call's id, sent with the first delta
  // required: where the array's text stands; an item is sent once its object closes.
  int32_t depth_ = 0;
  bool in_string_ = false, escaped_ = false;
  std::string item_;
};

}  // namespace ferry::gateway::http
