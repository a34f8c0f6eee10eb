// vLLM's extra request fields that would change the output and that Ferry does not serve
// (beam search, bad_words, logits processors, custom chat templates,
// ...): a value other than the field's default is refused with 400 naming the field and why,
// never ignored, so a client never gets an answer to another question than the one it asked.
#pragma once

#include <optional>

#include "gateway/http/openai_format.h"

namespace ferry::gateway::http {

// The first such field of body that asks for something, as a 400; chat's own fields only on chat.
std::optional<ApiError> RefuseUnservedFields(const json& body, Endpoint endpoint);

}  // namespace ferry::gateway::http
