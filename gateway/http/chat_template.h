// Renders chat messages into a prompt with the model's chat template. Only ChatML (Qwen's
// template, recognised by "<|im_start|>") is rendered, natively: no Jinja interpreter. The output
// equals transformers' apply_chat_template(messages, tools=tools, tokenize=False,
// add_generation_prompt=True) for Qwen2.5's template, tools, tool calls and tool results
// included (tool_calls.h has the request side).
#pragma once

#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace ferry::gateway::http {

struct ChatMessage {
  std::string role;  // system, user, assistant or tool
  std::string content;
  // assistant: the calls it made, as (name, arguments rendered by the template's tojson).
  std::vector<std::pair<std::string, std::string>> tool_calls;
};

// How the prompt ends (transformers' and vLLM's flags of the same names): with the assistant's
// turn opened (the default), after the last message's turn, or inside the last message, which
// the model then continues (a prefilled answer): the text is cut after that message's content,
// stripped, and trailing whitespace dropped, as transformers does.
struct ChatEnding {
  bool add_generation_prompt = true;
  bool continue_final_message = false;
};

class ChatTemplate {
 public:
  // Reads chat_template from tokenizer_config.json (a file, or the model directory holding it).
  // A missing file or template gives a template that refuses every request with a reason.
  static ChatTemplate FromTokenizerConfig(const std::string& path);
  // template_text: the Jinja source; ChatML when it contains "<|im_start|>".
  static ChatTemplate FromTemplateText(const std::string& template_text);

  bool is_supported() const { return unsupported_reason_.empty(); }
  // Why chat requests are refused; empty when supported.
  const std::string& unsupported_reason() const { return unsupported_reason_; }

  // The template has Qwen2.5's tool-calling branches (tools in the system turn, <tool_call>).
  bool has_tools() const { return has_tools_; }

  // The prompt. Call only when supported. tools: each tool as the template's tojson writes it
  // (none: no tools section).
  std::string Render(const std::vector<ChatMessage>& messages, const std::vector<std::string>& tools = {},
                     ChatEnding ending = ChatEnding()) const;

 private:
  std::string unsupported_reason_;
  bool has_tools_ = false;
  std::string default_system_;  // empty: no system message is added
};

}  // namespace ferry::gateway::http
