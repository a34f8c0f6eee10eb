// A chat generation on domain types: what /v1/chat/completions (ParseChatRequest,
// openai_format.h) and /v1/responses (ParseResponsesRequest, responses_format.h) each read their
// JSON into, naming their own fields in every error they find, and what BuildChatGeneration turns
// into the request that runs. The checks after reading (the template, the tools, a tool choice's
// constraint) are made once, here, for both; an error they find names the field the reader
// recorded (messages_field, ToolSpec::field) or one both APIs share (tools, tool_choice).
#pragma once

#include <string>
#include <variant>
#include <vector>

#include "gateway/http/chat_template.h"
#include "gateway/http/openai_format.h"
#include "gateway/http/tool_calls.h"

namespace ferry::gateway::http {

struct ChatRequest {
  // What every generation carries (sampling, lane, stream, timeout, ...): endpoint kChat, one
  // choice or n, no prompt yet. A structured output constraint the body asked for is in
  // request.generate.sampling.guided.
  OpenAiRequest request;
  std::vector<ChatMessage> messages;  // the conversation, oldest first
  ChatEnding ending;
  ToolsSpec tools;
  std::string messages_field = "messages";  // the conversation's field in the request's API
  nlohmann::ordered_json template_kwargs;     // chat_template_kwargs (null: none)
};

// The tools checked (BuildTools), a named or "required" tool choice's schema as the request's one
// constraint, and the prompt rendered with `chat` into request.generate and request.prompts.
std::variant<OpenAiRequest, ApiError> BuildChatGeneration(ChatRequest chat_request, const ChatTemplate& chat);

}  // namespace ferry::gateway::http
