#include "gateway/http/tokenize_api.h"

#include <fmt/format.h>

namespace ferry::gateway::http {

using nlohmann::ordered_json;

namespace {

// Fields vLLM's tokenizer API takes that change nothing here.
std::optional<ApiError> CheckOptionalBool(const json& body, const char* key) {
  if (body.contains(key) && !body[key].is_null() && !body[key].is_boolean()) {
    return InvalidField(key, fmt::format("{} must be a boolean, got {} ({})", key, body[key].type_name(),
                                         Brief(body[key])));
  }
  return std::nullopt;
}

}  // namespace

std::variant<std::string, ApiError> ParseTokenizeRequest(const json& body, const ChatTemplate& chat,
                                                         std::string_view body_text) {
  if (!body.is_object()) return InvalidField("", "the request body must be a JSON object");
  if (auto e = CheckOptionalBool(body, "add_special_tokens")) return *e;
  const bool has_prompt = body.contains("prompt") && !body["prompt"].is_null();
  const bool has_messages = body.contains("messages") && !body["messages"].is_null();
  if (has_prompt == has_messages) return InvalidField("prompt", "set exactly one of prompt and messages");
  if (has_messages) {
    // With tools, the prompt a chat request with them would generate from (vLLM's /tokenize).
    std::vector<ordered_json> tools;
    if (body.contains("tools") && !body["tools"].is_null()) {
      ordered_json ordered = ordered_json::parse(body_text, nullptr, /*allow_exceptions=*/false);
      if (ordered.is_discarded() || !ordered.is_object()) ordered = ordered_json::parse(body.dump());
      ordered["tool_choice"] = "none";  // the prompt is the same whichever is asked for
      auto parsed = ParseTools(ordered, chat.has_tools(), chat.tool_format());
      if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
      tools = std::move(std::get<ToolsRequest>(parsed).tools);
    }
    return RenderChatPrompt(body, body_text, chat, tools);
  }
  if (!body["prompt"].is_string()) {
    return InvalidField("prompt", fmt::format("prompt must be a string, got {} ({})", body["prompt"].type_name(),
                                              Brief(body["prompt"])));
  }
  return body["prompt"].get<std::string>();
}

bool TokenizeAddsSpecialTokens(const json& body) {
  if (body.contains("add_special_tokens") && body["add_special_tokens"].is_boolean()) {
    return body["add_special_tokens"].get<bool>();
  }
  return !(body.contains("messages") && !body["messages"].is_null());
}

std::variant<std::vector<int32_t>, ApiError> ParseDetokenizeRequest(const json& body, int32_t vocab_size) {
  if (!body.is_object()) return InvalidField("", "the request body must be a JSON object");
  if (!body.contains("tokens") || !body["tokens"].is_array()) {
    return InvalidField("tokens", "tokens must be a list of token ids");
  }
  const json& tokens = body["tokens"];
  std::vector<int32_t> ids;
  ids.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const json& t = tokens[i];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab_size) {
      return InvalidField("tokens", fmt::format("tokens[{}] = {} is not a token id in [0, {})", i, Brief(t),
                                                vocab_size));
    }
    ids.push_back(t.get<int32_t>());
  }
  return ids;
}

json TokenizeResponseJson(const std::vector<int32_t>& tokens, int32_t max_model_len) {
  return json{{"count", tokens.size()}, {"max_model_len", max_model_len}, {"tokens", tokens}};
}

json DetokenizeResponseJson(const std::string& text) { return json{{"prompt", text}}; }

}  // namespace ferry::gateway::http
