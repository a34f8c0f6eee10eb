// ferry-render-chat: the prompt the gateway renders for a chat request, without serving (template
// parity tests; checking a --chat-template before deploying it).
//   ferry-render-chat --model DIR [--chat-template FILE]
//   stdin: one chat request body per line ({"messages", "tools", "add_generation_prompt",
//   "continue_final_message", "chat_template_kwargs"}); stdout: {"prompt": text} or {"error": message}.
// The body goes through the gateway's own path (ParseTokenizeRequest, what /tokenize renders
// with), so what this prints is the text a chat completion generates from.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <iostream>
#include <string>

#include "gateway/http/chat_template.h"
#include "gateway/http/tokenize_api.h"

int main(int argc, char** argv) {
  using ferry::gateway::http::ApiError;
  using ferry::gateway::http::ChatTemplate;
  CLI::App app("Renders chat requests with a model's chat template, as the gateway does");
  std::string model, chat_template;
  app.add_option("--model", model, "the model directory (tokenizer_config.json, chat_template.jinja)")->required();
  app.add_option("--chat-template", chat_template, "a template in place of the model's own (a file, or the text)");
  CLI11_PARSE(app, argc, argv);
  auto loaded = ChatTemplate::Load(model, chat_template);
  if (auto* error = std::get_if<std::string>(&loaded)) {
    std::cerr << "chat template: " << *error << "\n";
    return 1;
  }
  const ChatTemplate& chat = std::get<ChatTemplate>(loaded);
  std::string line;
  while (std::getline(std::cin, line)) {
    nlohmann::json out;
    const nlohmann::json body = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!body.is_object() || !body.contains("messages")) {
      out = {{"error", "each line must be a chat request body with messages"}};
    } else {
      auto prompt = ferry::gateway::http::ParseTokenizeRequest(body, chat, line);
      if (auto* text = std::get_if<std::string>(&prompt)) {
        out = {{"prompt", *text}};
      } else {
        out = {{"error", std::get<ApiError>(prompt).message}};
      }
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n" << std::flush;
  }
  return 0;
}
