// vLLM's tokenizer API beside the OpenAI one, for clients that count or check tokens with the
// served model's own tokenizer:
//   POST /tokenize   {"prompt": "..."} or {"messages": [...]}  ->  {"count", "max_model_len", "tokens"}
//   POST /detokenize {"tokens": [...]}                          ->  {"prompt"}
// "model" is accepted and ignored, as on the other endpoints. Messages are rendered with the chat
// template and the assistant's turn opened (vLLM's add_generation_prompt, its default);
// add_special_tokens as vLLM's: a prompt's default true, messages' false (the template writes them).
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <string_view>
#include <vector>

#include "gateway/http/chat_template.h"
#include "gateway/http/openai_format.h"

namespace ferry::gateway::http {

// The text /tokenize encodes.
// body_text: the text body was parsed from (tools are rendered in its key order; empty: sorted).
std::variant<std::string, ApiError> ParseTokenizeRequest(const json& body, const ChatTemplate& chat,
                                                         std::string_view body_text = {});
// Whether /tokenize encodes with the tokenizer's special tokens (a body ParseTokenizeRequest took).
bool TokenizeAddsSpecialTokens(const json& body);
// The ids /detokenize decodes, each checked against [0, vocab_size).
std::variant<std::vector<int32_t>, ApiError> ParseDetokenizeRequest(const json& body, int32_t vocab_size);

json TokenizeResponseJson(const std::vector<int32_t>& tokens, int32_t max_model_len);
json DetokenizeResponseJson(const std::string& text);

}  // namespace ferry::gateway::http
