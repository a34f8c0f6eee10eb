#include "gateway/http/chat_template.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace ferry::gateway::http {

namespace {

constexpr std::string_view kQwenDefaultSystem = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

constexpr const char* kSpace = " \t\n\r\f\v";

std::string Strip(const std::string& s) {
  const size_t first = s.find_first_not_of(kSpace);
  if (first == std::string::npos) return {};
  return s.substr(first, s.find_last_not_of(kSpace) - first + 1);
}

void AppendTurn(std::string& out, const std::string& role, const std::string& content) {
  out += "<|im_start|>" + role + "\n" + content + "<|im_end|>\n";
}

// Qwen2.5's system turn with tools: the system text, then the tools' signatures and the format
// of a call.
void AppendToolsSystem(std::string& out, const std::string& system, const std::vector<std::string>& tools) {
  out += "<|im_start|>system\n" + system +
         "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
         "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
  for (const std::string& tool : tools) out += "\n" + tool;
  out += "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
         "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
         "<args-json-object>}\n</tool_call><|im_end|>\n";
}

void AppendToolCalls(std::string& out, const ChatMessage& m) {
  out += "<|im_start|>assistant";
  if (!m.content.empty()) out += "\n" + m.content;
  for (const auto& [name, arguments] : m.tool_calls) {
    out += "\n<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": " + arguments + "}\n</tool_call>";
  }
  out += "<|im_end|>\n";
}

}  // namespace

ChatTemplate ChatTemplate::FromTokenizerConfig(const std::string& path) {
  std::string file = path;
  if (std::filesystem::is_directory(file)) file += "/tokenizer_config.json";
  ChatTemplate t;
  std::ifstream in(file);
  if (!in) {
    t.unsupported_reason_ = "the model has no tokenizer_config.json, so no chat template";
    return t;
  }
  nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object() || !config.contains("chat_template") || !config["chat_template"].is_string()) {
    t.unsupported_reason_ = "the model's tokenizer_config.json has no chat_template (string)";
    return t;
  }
  return FromTemplateText(config["chat_template"].get<std::string>());
}

ChatTemplate ChatTemplate::FromTemplateText(const std::string& template_text) {
  ChatTemplate t;
  if (template_text.find("<|im_start|>") == std::string::npos) {
    t.unsupported_reason_ = "the model's chat template is not ChatML; only ChatML templates are supported "
                            "(use /v1/completions with a rendered prompt)";
    return t;
  }
  // Qwen2.5 adds its default system message when the conversation has none.
  if (template_text.find(kQwenDefaultSystem) != std::string::npos) t.default_system_ = kQwenDefaultSystem;
  t.has_tools_ = template_text.find("<tool_call>") != std::string::npos;
  return t;
}

std::string ChatTemplate::Render(const std::vector<ChatMessage>& messages, const std::vector<std::string>& tools,
                                 ChatEnding ending) const {
  std::string out;
  const bool system_first = !messages.empty() && messages[0].role == "system";
  if (!tools.empty()) {
    AppendToolsSystem(out, system_first ? messages[0].content : default_system_, tools);
  } else if (system_first) {
    AppendTurn(out, "system", messages[0].content);
  } else if (!default_system_.empty()) {
    AppendTurn(out, "system", default_system_);
  }
  for (size_t i = system_first ? 1 : 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") {  // a run of tool results is one user turn
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    } else if (m.role == "assistant" && !m.tool_calls.empty()) {
      AppendToolCalls(out, m);
    } else {
      AppendTurn(out, m.role, m.content);
    }
  }
  if (ending.add_generation_prompt) out += "<|im_start|>assistant\n";
  if (ending.continue_final_message && !messages.empty()) {
    const std::string final_text = Strip(messages.back().content);
    const size_t at = out.rfind(final_text);
    if (at != std::string::npos) out.resize(at + final_text.size());
    out.resize(out.find_last_not_of(kSpace) + 1);  // npos + 1 == 0: all whitespace
  }
  return out;
}

}  // namespace ferry::gateway::http
