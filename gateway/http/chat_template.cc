#include "gateway/http/chat_template.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace ferry::gateway::http {

namespace {

constexpr std::string_view kQwenDefaultSystem = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

void AppendTurn(std::string& out, const std::string& role, const std::string& content) {
  out += "<|im_start|>" + role + "\n" + content + "<|im_end|>\n";
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
  return t;
}

std::string ChatTemplate::Render(const std::vector<ChatMessage>& messages) const {
  std::string out;
  size_t first = 0;
  if (!messages.empty() && messages[0].role == "system") {
    AppendTurn(out, "system", messages[0].content);
    first = 1;
  } else if (!default_system_.empty()) {
    AppendTurn(out, "system", default_system_);
  }
  for (size_t i = first; i < messages.size(); ++i) AppendTurn(out, messages[i].role, messages[i].content);
  out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace ferry::gateway::http
