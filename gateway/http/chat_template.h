// Renders chat messages into a prompt with the model's own chat template, as transformers'
// apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=...,
// continue_final_message=..., **chat_template_kwargs) does, on Ferry's Jinja subset
// (gateway/jinja). The messages are the dicts vLLM gives the template: role and content (text
// parts joined), an assistant's tool_calls as [{"id", "type": "function", "function": {"name",
// "arguments"}}] with the arguments parsed from their JSON text, a tool result's tool_call_id.
// The template's variables are those, tools (None without), documents (None), the special tokens
// of tokenizer_config.json (bos_token, eos_token, ...), and the request's chat_template_kwargs.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "gateway/http/tool_formats.h"

namespace ferry::gateway::jinja {
class Template;
class Dict;
}

namespace ferry::gateway::http {

struct ChatToolCall {
  std::string id;                     // empty: none given (the key is left out)
  std::string name;
  nlohmann::ordered_json arguments;   // the parsed JSON, or the text as a string when it is not JSON
};

struct ChatMessage {
  std::string role;  // system, user, assistant or tool
  std::string content;
  std::vector<ChatToolCall> tool_calls;  // assistant: the calls it made
  std::string tool_call_id;              // tool: the call it answers (empty: none given)
};

// How the prompt ends (transformers' and vLLM's flags of the same names): with the assistant's
// turn opened (the default), after the last message's turn, or inside the last message, which
// the model then continues (a prefilled answer): the text is cut after that message's content,
// stripped, and trailing whitespace dropped, as transformers does.
struct ChatEnding {
  bool add_generation_prompt = true;
  bool continue_final_message = false;
};

// Why a render failed: the template's raise_exception message, or what jinja2 would raise.
struct ChatTemplateError {
  std::string message;
};

class ChatTemplate {
 public:
  // The model's template: `override_template` when given (vLLM's --chat-template: a file, or the
  // template text itself), else chat_template.jinja in the model directory, else
  // tokenizer_config.json's chat_template (a string, or named templates: "default", and
  // "tool_use" for a request with tools). No template at all gives one that refuses chat requests
  // with the reason; a template Ferry cannot render is an error naming the file and the construct.
  static std::variant<ChatTemplate, std::string> Load(const std::string& model_path,
                                                      const std::string& override_template = "");
  // A template's text; a parse error gives a template that refuses every request with it.
  // special_tokens: the variables bos_token, eos_token, ... (an object of strings and lists).
  static ChatTemplate FromTemplateText(const std::string& template_text,
                                       const nlohmann::ordered_json& special_tokens = nlohmann::ordered_json::object());

  // One that refuses every chat request with `reason`.
  static ChatTemplate Unavailable(std::string reason) {
    ChatTemplate t;
    t.unsupported_reason_ = std::move(reason);
    return t;
  }

  bool is_supported() const { return unsupported_reason_.empty(); }
  // Why chat requests are refused; empty when supported.
  const std::string& unsupported_reason() const { return unsupported_reason_; }

  // The template renders tools (it reads the `tools` variable).
  bool has_tools() const { return has_tools_; }
  // How the model answers tool_choice "auto": the format its template writes past calls in
  // (ToolFormatOfTemplate), or what --tool-call-parser set.
  ToolFormat tool_format() const { return tool_format_; }
  void set_tool_format(ToolFormat format) { tool_format_ = format; }

  // The prompt, or why the template refused (its raise_exception, or what jinja2 would raise).
  // Call only when supported. tools: each tool as the request gave it (none: tools is None).
  // kwargs: the request's chat_template_kwargs (an object; null: none).
  std::variant<std::string, ChatTemplateError> Render(const std::vector<ChatMessage>& messages,
                                                const std::vector<nlohmann::ordered_json>& tools = {},
                                                ChatEnding ending = ChatEnding(),
                                                const nlohmann::ordered_json& kwargs = nullptr) const;

 private:
  struct Named {
    std::string name;
    std::shared_ptr<const jinja::Template> body;
  };
  static std::variant<ChatTemplate, std::string> Parse(const std::vector<std::pair<std::string, std::string>>& named,
                                                       const nlohmann::ordered_json& special_tokens,
                                                       const std::string& origin);

  // The template's variables (messages, tools, documents, add_generation_prompt, the special
  // tokens, kwargs); throws jinja::Error on a value nested past jinja's bound.
  jinja::Dict Variables(const std::vector<ChatMessage>& messages, const std::vector<nlohmann::ordered_json>& tools,
                        ChatEnding ending, const nlohmann::ordered_json& kwargs) const;

  std::string unsupported_reason_;
  bool has_tools_ = false;
  ToolFormat tool_format_ = ToolFormat::kNone;
  std::vector<Named> templates_;  // "default" first when named
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
};

}  // namespace ferry::gateway::http
