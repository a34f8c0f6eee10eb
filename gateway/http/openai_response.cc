// Response side of openai_format.h: whole responses and SSE chunks.
#include <algorithm>
#include <string>
#include <utility>

#include "common/utf8.h"
#include "gateway/http/openai_format.h"

namespace ferry::gateway::http {

namespace {

using google::protobuf::RepeatedPtrField;
using ferry::v1::TokenLogprob;

json TokenBytes(const std::string& token) {
  json bytes = json::array();
  for (unsigned char c : token) bytes.push_back(static_cast<int>(c));
  return bytes;
}

// OpenAI's completions logprobs: parallel lists plus text offsets.
json CompletionLogprobs(const RepeatedPtrField<TokenLogprob>& logprobs, int64_t& text_offset) {
  json out = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  for (const TokenLogprob& lp : logprobs) {
    out["tokens"].push_back(lp.token());
    if (!lp.has_logprob()) {  // an echoed prompt's first token: nothing predicts it
      out["token_logprobs"].push_back(nullptr);
      out["top_logprobs"].push_back(nullptr);
    } else {
      out["token_logprobs"].push_back(lp.logprob());
      json top = json::object();
      for (const auto& t : lp.top()) top[t.token()] = t.logprob();
      out["top_logprobs"].push_back(top);
    }
    out["text_offset"].push_back(text_offset);
    text_offset += static_cast<int64_t>(lp.token().size());
  }
  return out;
}

// OpenAI's chat logprobs: {"content": [{token, logprob, bytes, top_logprobs}]}.
json ChatLogprobs(const RepeatedPtrField<TokenLogprob>& logprobs) {
  json content = json::array();
  for (const TokenLogprob& lp : logprobs) {
    json top = json::array();
    for (const auto& t : lp.top()) {
      top.push_back({{"token", t.token()}, {"logprob", t.logprob()}, {"bytes", TokenBytes(t.token())}});
    }
    content.push_back(
        {{"token", lp.token()}, {"logprob", lp.logprob()}, {"bytes", TokenBytes(lp.token())}, {"top_logprobs", top}});
  }
  return json{{"content", content}};
}

// vLLM's prompt_logprobs: per prompt token null (the first) or {"<id>": {logprob, rank,
// decoded_token}} for the token itself and each of the top N.
json VllmPromptLogprobs(const RepeatedPtrField<TokenLogprob>& logprobs) {
  json out = json::array();
  for (const TokenLogprob& lp : logprobs) {
    if (!lp.has_logprob()) {
      out.push_back(nullptr);
      continue;
    }
    json entry = {{std::to_string(lp.token_id()),
                   {{"logprob", lp.logprob()}, {"rank", lp.rank()}, {"decoded_token", lp.token()}}}};
    int32_t rank = 1;
    for (const auto& t : lp.top()) {
      const std::string key = std::to_string(t.token_id());
      if (!entry.contains(key)) entry[key] = {{"logprob", t.logprob()}, {"rank", rank}, {"decoded_token", t.token()}};
      ++rank;
    }
    out.push_back(std::move(entry));
  }
  return out;
}

json UsageJson(const ferry::v1::Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens()},
          {"completion_tokens", usage.completion_tokens()},
          {"total_tokens", usage.prompt_tokens() + usage.completion_tokens()},
          {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens()}}}};
}

json Envelope(const ResponseContext& ctx, const char* object) {
  return {{"id", ctx.id}, {"object", object}, {"created", ctx.created}, {"model", ctx.model}};
}

json FinishJson(ferry::v1::FinishReason reason, bool tools_called = false) {
  if (reason == ferry::v1::FINISH_REASON_UNSPECIFIED) return nullptr;
  return tools_called ? "tool_calls" : FinishReasonName(reason);  // vLLM's rule with tool_choice "auto"
}

// A chat choice's message with tools asked for: the calls its text holds (tool_calls.h).
json ToolsMessage(const ToolsRequest& tools, const std::string& text, bool& tools_called) {
  const ParsedOutput parsed = ParseChoiceOutput(tools, text);
  json calls = json::array();
  for (const ToolCall& c : parsed.calls) {
    calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  tools_called = tools.choice != ToolsRequest::Choice::kNamed && !parsed.calls.empty();
  return {{"role", "assistant"}, {"content", parsed.content ? json(*parsed.content) : json(nullptr)}, {"tool_calls", calls}};
}

}  // namespace

std::string FinishReasonName(ferry::v1::FinishReason reason) {
  switch (reason) {
    case ferry::v1::FINISH_REASON_LENGTH:
    case ferry::v1::FINISH_REASON_TIMEOUT: return "length";
    default: return "stop";
  }
}

json CompletionResponseJson(const ResponseContext& ctx, const std::vector<ferry::v1::GenerateResponse>& choices,
                            int32_t n, const ToolsRequest* tools) {
  json out = Envelope(ctx, ctx.endpoint == Endpoint::kChat ? "chat.completion" : "text_completion");
  out["choices"] = json::array();
  ferry::v1::Usage usage;  // the prompt once, the completions of every choice
  for (size_t i = 0; i < choices.size(); ++i) {
    const ferry::v1::GenerateResponse& response = choices[i];
    const bool has_logprobs = response.logprobs_size() > 0;
    json choice = {{"index", i}, {"finish_reason", FinishJson(response.finish_reason())}, {"logprobs", nullptr}};
    if (ctx.endpoint == Endpoint::kChat && tools != nullptr && tools->active() &&
        tools->choice != ToolsRequest::Choice::kNone) {
      bool called = false;
      choice["message"] = ToolsMessage(*tools, response.text(), called);
      choice["finish_reason"] = FinishJson(response.finish_reason(), called);
      if (has_logprobs) choice["logprobs"] = ChatLogprobs(response.logprobs());
    } else if (ctx.endpoint == Endpoint::kChat) {
      choice["message"] = {{"role", "assistant"}, {"content", response.text()}};
      if (has_logprobs) choice["logprobs"] = ChatLogprobs(response.logprobs());
    } else {
      choice["text"] = response.text();
      int64_t offset = 0;
      if (has_logprobs) choice["logprobs"] = CompletionLogprobs(response.logprobs(), offset);
      if (ctx.prompt_logprobs) choice["prompt_logprobs"] = VllmPromptLogprobs(response.prompt_logprobs());
    }
    out["choices"].push_back(std::move(choice));
    AddChoiceUsage(response.usage(), i, n, usage);
  }
  out["usage"] = UsageJson(usage);
  // Chat: once for the request (every choice has the same prompt), as vLLM.
  if (ctx.prompt_logprobs && ctx.endpoint == Endpoint::kChat && !choices.empty()) {
    out["prompt_logprobs"] = VllmPromptLogprobs(choices.front().prompt_logprobs());
  }
  return out;
}

void ApplyEcho(const std::vector<std::string>& prompt_texts, int32_t n,
               std::vector<ferry::v1::GenerateResponse>& responses) {
  for (size_t i = 0; i < responses.size(); ++i) {
    ferry::v1::GenerateResponse& r = responses[i];
    r.set_text(prompt_texts.at(i / static_cast<size_t>(n)) + r.text());
    if (r.prompt_logprobs_size() == 0) continue;
    RepeatedPtrField<TokenLogprob> all = r.prompt_logprobs();  // kept for vLLM's prompt_logprobs
    all.MergeFrom(r.logprobs());
    *r.mutable_logprobs() = std::move(all);
  }
}

StreamEcho::StreamEcho(std::vector<std::string> prompt_texts, int32_t n, int32_t num_choices)
    : prompt_texts_(std::move(prompt_texts)), n_(n), choices_(static_cast<size_t>(num_choices)) {}

std::optional<ferry::v1::GenerateChunk> StreamEcho::Apply(int32_t index, const ferry::v1::GenerateChunk& chunk) {
  Choice& c = choices_.at(static_cast<size_t>(index));
  if (c.is_sent) return chunk;
  c.held.MergeFrom(chunk.prompt_logprobs());
  if (chunk.token_ids_size() == 0 && chunk.text().empty() &&
      chunk.finish_reason() == ferry::v1::FINISH_REASON_UNSPECIFIED) {
    return std::nullopt;  // only prompt logprobs so far
  }
  ferry::v1::GenerateChunk out = chunk;
  out.clear_prompt_logprobs();
  out.set_text(prompt_texts_.at(static_cast<size_t>(index / n_)) + chunk.text());
  if (!c.held.empty()) {
    c.held.MergeFrom(chunk.logprobs());
    *out.mutable_logprobs() = std::move(c.held);
  }
  c.is_sent = true;
  return out;
}

json StreamChunkJson(const ResponseContext& ctx, const ferry::v1::GenerateChunk& chunk, StreamState& state) {
  json choice = {{"index", state.index},
                 {"finish_reason", FinishJson(chunk.finish_reason(), state.tools_called)},
                 {"logprobs", nullptr}};
  json out;
  if (ctx.endpoint == Endpoint::kChat) {
    out = Envelope(ctx, "chat.completion.chunk");
    json delta = json::object();
    if (!state.is_role_sent) delta["role"] = "assistant";
    if (!chunk.text().empty() || !state.is_role_sent) delta["content"] = chunk.text();
    if (!state.tool_calls.is_null()) delta["tool_calls"] = state.tool_calls;
    state.is_role_sent = true;
    choice["delta"] = delta;
    if (chunk.logprobs_size() > 0) choice["logprobs"] = ChatLogprobs(chunk.logprobs());
  } else {
    out = Envelope(ctx, "text_completion");
    choice["text"] = chunk.text();
    if (chunk.logprobs_size() > 0) choice["logprobs"] = CompletionLogprobs(chunk.logprobs(), state.text_offset);
  }
  out["choices"] = json::array({choice});
  return out;
}

std::string StreamChunkEvent(const ResponseContext& ctx, const ferry::v1::GenerateChunk& chunk, StreamState& state) {
  if (chunk.logprobs_size() > 0 || !state.tool_calls.is_null() || state.tools_called || !IsValidUtf8(chunk.text()) ||
      !IsValidUtf8(ctx.id) || !IsValidUtf8(ctx.model)) {
    return SseEvent(StreamChunkJson(ctx, chunk, state));
  }
  // nlohmann's objects are sorted maps: keys go out in that order, so the bytes are the same.
  const bool chat = ctx.endpoint == Endpoint::kChat;
  std::string out;
  out.reserve(192 + ctx.id.size() + ctx.model.size() + chunk.text().size());
  out += "data: {\"choices\":[{";
  if (chat) {
    out += "\"delta\":{";
    if (!chunk.text().empty() || !state.is_role_sent) {
      out += "\"content\":";
      AppendJsonString(out, chunk.text());
      if (!state.is_role_sent) out += ",\"role\":\"assistant\"";
    }
    out += "},";
    state.is_role_sent = true;
  }
  out += "\"finish_reason\":";
  if (chunk.finish_reason() == ferry::v1::FINISH_REASON_UNSPECIFIED) {
    out += "null";
  } else {
    AppendJsonString(out, FinishReasonName(chunk.finish_reason()));
  }
  out += ",\"index\":" + std::to_string(state.index) + ",\"logprobs\":null";
  if (!chat) {
    out += ",\"text\":";
    AppendJsonString(out, chunk.text());
  }
  out += "}],\"created\":" + std::to_string(ctx.created) + ",\"id\":";
  AppendJsonString(out, ctx.id);
  out += ",\"model\":";
  AppendJsonString(out, ctx.model);
  out += chat ? ",\"object\":\"chat.completion.chunk\"}\n\n" : ",\"object\":\"text_completion\"}\n\n";
  return out;
}

json StreamUsageJson(const ResponseContext& ctx, const ferry::v1::Usage& usage) {
  json out = Envelope(ctx, ctx.endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion");
  out["choices"] = json::array();
  out["usage"] = UsageJson(usage);
  return out;
}

void AddChoiceUsage(const ferry::v1::Usage& choice, size_t index, int32_t n, ferry::v1::Usage& total) {
  if (index % static_cast<size_t>(std::max(n, 1)) == 0) {
    total.set_prompt_tokens(total.prompt_tokens() + choice.prompt_tokens());
    total.set_cached_tokens(total.cached_tokens() + choice.cached_tokens());
  }
  total.set_completion_tokens(total.completion_tokens() + choice.completion_tokens());
}

std::string SseEvent(const json& data) {
  return "data: " + data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace ferry::gateway::http
