// Helpers of the HTTP format tests: parse a completion request expecting it to pass or fail,
// and a ChatML template with Qwen's default system message.
#pragma once

#include <gtest/gtest.h>

#include "gateway/http/openai_format.h"
#include "gateway/tokenizer/bpe_trainer.h"

namespace ferry::gateway::http {

inline OpenAiRequest ParseOk(const json& body) {
  auto r = ParseCompletionRequest(body);
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << e->message;
  return std::get<OpenAiRequest>(r);
}

inline ApiError ParseError(const json& body) {
  auto r = ParseCompletionRequest(body);
  EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << body.dump();
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

// Qwen2.5-Instruct's own template.
inline const ChatTemplate& Qwen() {
  static const ChatTemplate t = ChatTemplate::FromTemplateText(std::string(tokenizer::Qwen25ChatTemplate()));
  return t;
}

}  // namespace ferry::gateway::http
