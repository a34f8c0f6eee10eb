#include "gateway/http/unserved_fields.h"

#include <fmt/format.h>

namespace ferry::gateway::http {
namespace {

// vLLM's extra fields that would change the output, with the value that asks for nothing (its
// default) and why each is refused otherwise.
struct Unserved {
  const char* key;
  json asks_nothing;
  const char* why;
};

const std::vector<Unserved>& UnservedFields() {
  static const std::vector<Unserved> kFields = {
      {"use_beam_search", false, "beam search is not supported"},
      {"length_penalty", 1.0, "it applies to beam search, which is not supported"},
      {"early_stopping", false, "it applies to beam search, which is not supported"},
      {"bad_words", json::array(), "it is not supported (logit_bias bans single tokens)"},
      {"spaces_between_special_tokens", true, "special tokens are always skipped in the text"},
      {"guided_whitespace_pattern", "", "it is not supported (JSON whitespace runs are at most 32 bytes)"},
      {"logits_processors", json::array(), "it is not supported"},
      {"return_tokens_as_token_ids", false, "it is not supported"},
      {"priority", 0, "Ferry schedules by lane: set \"lane\" (or the X-Ferry-Lane header)"},
  };
  return kFields;
}

// Chat fields of vLLM's that change the prompt or the answer; refused the same way.
const std::vector<Unserved>& UnservedChatFields() {
  static const std::vector<Unserved> kFields = {
      {"echo", false, "it is not supported on chat (/v1/completions echoes the prompt)"},
      {"chat_template", "", "the model's own template is used (or the gateway's --chat-template); a template per "
                            "request is not served"},
      {"documents", json::array(), "it is not supported"},
  };
  return kFields;
}

std::optional<ApiError> Refuse(const json& body, const std::vector<Unserved>& fields) {
  for (const Unserved& f : fields) {
    if (!body.contains(f.key) || body[f.key].is_null() || body[f.key] == f.asks_nothing) continue;
    return InvalidField(f.key, fmt::format("{} = {}: {}", f.key, Brief(body[f.key]), f.why));
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> RefuseUnservedFields(const json& body, Endpoint endpoint) {
  // Chat's own fields first: "echo" means another thing on /v1/completions, which serves it.
  if (endpoint == Endpoint::kChat) {
    if (auto e = Refuse(body, UnservedChatFields())) return e;
  }
  return Refuse(body, UnservedFields());
}

}  // namespace ferry::gateway::http
