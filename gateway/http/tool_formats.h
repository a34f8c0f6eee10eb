// The formats models answer tool_choice "auto" in, one per family, as vLLM's --tool-call-parser
// names them, and the parsers of each (whole text and streamed). The chat template says which a
// model was trained on (ToolFormatOfTemplate); the gateway's --tool-call-parser overrides it.
//   hermes       Qwen2.5/Qwen3:  <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call> (tool_calls.h)
//   llama3_json  Llama 3.1/3.2:  {"name": ..., "parameters": {...}}, several joined by "; ",
//                                optionally after <|python_tag|>; the text is all calls or none
//   mistral      Mistral v0.3:   [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...] after any
//                                content; the call ids are 9 letters and digits, as its template checks
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace ferry::gateway::http {

enum class ToolFormat { kNone, kHermes, kLlama3Json, kMistral };

// vLLM's parser names: "hermes", "llama3_json", "mistral"; nullopt for another.
std::optional<ToolFormat> ToolFormatFromName(std::string_view name);
const char* ToolFormatName(ToolFormat format);  // kNone: "none"
// The format the template writes past calls in; kNone when it is none of the three.
ToolFormat ToolFormatOfTemplate(const std::string& template_text);

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text
};

// What one choice's whole text says.
struct ParsedOutput {
  std::optional<std::string> content;  // nullopt: JSON null (the text was all calls)
  std::vector<ToolCall> calls;
};

// A new call id in the format's form: "chatcmpl-tool-<32 hex>", or Mistral's 9 alphanumerics.
std::string NewToolCallId(ToolFormat format = ToolFormat::kHermes);

// tool_choice "auto": the calls `text` holds in `format` (kHermes: ParseHermesOutput). Text that
// does not parse as calls stays content, as vLLM's parsers leave it.
ParsedOutput ParseLlama3JsonOutput(const std::string& text, bool parallel);
ParsedOutput ParseMistralOutput(const std::string& text, bool parallel);

// A streamed choice in llama3_json or mistral: content goes out as it comes until the calls
// start (llama3_json: the text's first character is "{" or it opens with <|python_tag|>;
// mistral: [TOOL_CALLS]); the calls are held and parsed at the end, then sent whole.
class HeldToolCalls {
 public:
  HeldToolCalls(ToolFormat format, bool parallel) : format_(format), parallel_(parallel) {}
  // The content to send now.
  std::string Feed(const std::string& text);
  // At the end: the held text parsed (its calls, and content when it was not calls).
  ParsedOutput Finish();

 private:
  const ToolFormat format_;
  const bool parallel_;
  std::string held_;
  bool calls_started_ = false;
  bool decided_ = false;  // llama3_json: whether the text is calls is known
};

}  // namespace ferry::gateway::http
