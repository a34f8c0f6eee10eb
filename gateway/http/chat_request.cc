#include "gateway/http/chat_request.h"

#include <fmt/format.h>

namespace ferry::gateway::http {

std::variant<OpenAiRequest, ApiError> BuildChatGeneration(ChatRequest chat_request, const ChatTemplate& chat) {
  OpenAiRequest& r = chat_request.request;
  if (!chat.is_supported()) return InvalidField(chat_request.messages_field, chat.unsupported_reason());
  auto tools = BuildTools(chat_request.tools, chat.has_tools(), chat.tool_format());
  if (auto* e = std::get_if<ApiError>(&tools)) return *e;
  r.tools = std::move(std::get<ToolsRequest>(tools));
  // Mistral marks its calls with the special token [TOOL_CALLS]: the text keeps special tokens
  // for the parser to see it, as vLLM's mistral parser asks (unless the client said otherwise).
  auto& sampling = *r.generate.mutable_sampling();
  if (r.tools.active() && r.tools.format == ToolFormat::kMistral && r.tools.choice == ToolsRequest::Choice::kAuto &&
      !sampling.has_skip_special_tokens()) {
    sampling.set_skip_special_tokens(false);
  }
  // A named choice generates the function's arguments under its parameters' schema, "required"
  // an array of calls under the tools' schemas: the request's one structured output constraint.
  const bool named = r.tools.choice == ToolsRequest::Choice::kNamed;
  if (named || r.tools.choice == ToolsRequest::Choice::kRequired) {
    auto& s = *r.generate.mutable_sampling();
    if (s.has_guided()) {
      return InvalidField("tool_choice", fmt::format("tool_choice {} generates calls under the tools' schemas: it "
                                                     "conflicts with the request's other structured output constraint",
                                                     named ? "naming a function" : "\"required\""));
    }
    s.mutable_guided()->set_json_schema(r.tools.named_schema);
  }
  auto prompt = chat.Render(chat_request.messages, r.tools.tools, chat_request.ending, chat_request.template_kwargs);
  if (auto* e = std::get_if<ChatTemplateError>(&prompt)) {
    return InvalidField(chat_request.messages_field, "the model's chat template refused the conversation: " + e->message);
  }
  r.generate.set_text(std::move(std::get<std::string>(prompt)));
  r.prompts.clear();
  r.prompts.emplace_back().set_text(r.generate.text());
  return std::move(r);
}

}  // namespace ferry::gateway::http
