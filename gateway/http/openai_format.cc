#include "gateway/http/openai_format.h"

#include <algorithm>

#include <fmt/format.h>

#include "gateway/http/chat_request.h"
#include "gateway/http/guided_format.h"
#include "gateway/http/tool_calls.h"
#include "gateway/http/unserved_fields.h"
#include "gateway/request_validation.h"  // the gateway's limits
#include "proto/speculative.h"

namespace ferry::gateway::http {

namespace {

using ferry::v1::SamplingParams;
using nlohmann::ordered_json;
using Error = std::optional<ApiError>;

// Validation messages start with the proto field ("sampling.top_p = 2 must be ..."); the
// OpenAI parameter is its last component without an index.
std::string ParamFromMessage(const std::string& message) {
  std::string field = message.substr(0, message.find_first_of(" ("));
  if (field.rfind("sampling.", 0) == 0) field = field.substr(9);
  field = field.substr(0, field.find('['));
  if (field == "text" || field == "token_ids.ids" || field == "prompt") return "prompt";
  // A choice list comes from guided_choice or structured_outputs.choice: vLLM's name stands for
  // both (the message names the list's entry). json_object = false never comes from HTTP.
  if (field == "guided.choice.choices") return "guided_choice";
  if (field == "guided") return "";  // "guided decoding is not supported ...": whichever field asked
  // The HTTP layer checks a schema and a regex itself, naming the field that gave it; one refused
  // later came from any of the fields that set it (response_format, guided_json or
  // structured_outputs.json; guided_regex or structured_outputs.regex).
  if (field.rfind("guided.json_schema", 0) == 0 || field.rfind("guided.regex", 0) == 0 ||
      field.rfind("guided.grammar", 0) == 0) {
    return "";
  }
  return field;
}


}  // namespace

Error GetNumber(const json& body, const char* key, std::optional<double>& out) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  if (!body[key].is_number()) return WrongType(key, body[key], "a number");
  out = body[key].get<double>();
  return std::nullopt;
}

Error GetInt(const json& body, const char* key, std::optional<int64_t>& out) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  if (!body[key].is_number_integer()) return WrongType(key, body[key], "an integer");
  if (body[key].is_number_unsigned() && body[key].get<uint64_t>() > INT64_MAX) {
    return InvalidField(key, fmt::format("{} = {} is out of range", key, body[key].dump()));
  }
  out = body[key].get<int64_t>();
  return std::nullopt;
}

Error GetBool(const json& body, const char* key, std::optional<bool>& out) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  if (!body[key].is_boolean()) return WrongType(key, body[key], "a boolean");
  out = body[key].get<bool>();
  return std::nullopt;
}

Error GetString(const json& body, const char* key, std::optional<std::string>& out) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  if (!body[key].is_string()) return WrongType(key, body[key], "a string");
  out = body[key].get<std::string>();
  return std::nullopt;
}

// int32 fields: out-of-range values are refused here rather than wrapped.
Error GetInt32(const json& body, const char* key, std::optional<int32_t>& out) {
  std::optional<int64_t> v;
  if (Error e = GetInt(body, key, v)) return e;
  if (v && (*v < INT32_MIN || *v > INT32_MAX)) return InvalidField(key, fmt::format("{} = {} is out of range", key, *v));
  if (v) out = static_cast<int32_t>(*v);
  return std::nullopt;
}

namespace {

Error ParseStop(const json& body, SamplingParams& s) {
  if (!body.contains("stop") || body["stop"].is_null()) return std::nullopt;
  const json& stop = body["stop"];
  if (stop.is_string()) {
    s.add_stop(stop.get<std::string>());
    return std::nullopt;
  }
  if (!stop.is_array()) return WrongType("stop", stop, "a string or a list of strings");
  for (const json& item : stop) {
    if (!item.is_string()) return WrongType("stop", item, "a string");
    s.add_stop(item.get<std::string>());
  }
  return std::nullopt;
}

// An integer JSON value within int32 (a token id must be; larger ones are refused, not wrapped).
bool FitsInt32(const json& v) {
  return v.is_number_unsigned() ? v.get<uint64_t>() <= INT32_MAX
                                : v.get<int64_t>() >= INT32_MIN && v.get<int64_t>() <= INT32_MAX;
}

Error ParseStopTokenIds(const json& body, SamplingParams& s) {
  if (!body.contains("stop_token_ids") || body["stop_token_ids"].is_null()) return std::nullopt;
  const json& ids = body["stop_token_ids"];
  if (!ids.is_array()) return WrongType("stop_token_ids", ids, "a list of integers");
  for (const json& id : ids) {
    if (!id.is_number_integer()) return WrongType("stop_token_ids", id, "an integer");
    if (!FitsInt32(id)) {
      return InvalidField("stop_token_ids", fmt::format("stop_token_ids value {} is not a token id", id.dump()));
    }
    s.add_stop_token_ids(static_cast<int32_t>(id.get<int64_t>()));
  }
  return std::nullopt;
}

// Floats and the sampling fields both endpoints share.
Error ParseSamplingFloats(const json& body, SamplingParams& s) {
  std::optional<double> temperature, top_p, min_p, repetition, presence, frequency;
  for (auto [key, out] : {std::pair{"temperature", &temperature}, {"top_p", &top_p}, {"min_p", &min_p},
                          {"repetition_penalty", &repetition}, {"presence_penalty", &presence},
                          {"frequency_penalty", &frequency}}) {
    if (Error e = GetNumber(body, key, *out)) return e;
  }
  if (temperature) s.set_temperature(static_cast<float>(*temperature));
  if (top_p) s.set_top_p(static_cast<float>(*top_p));
  if (min_p) s.set_min_p(static_cast<float>(*min_p));
  if (repetition) s.set_repetition_penalty(static_cast<float>(*repetition));
  if (presence) s.set_presence_penalty(static_cast<float>(*presence));
  if (frequency) s.set_frequency_penalty(static_cast<float>(*frequency));
  return std::nullopt;
}

// {"<token id>": bias, ...}: OpenAI's keys are token ids written as strings.
Error ParseLogitBias(const json& body, SamplingParams& s) {
  if (!body.contains("logit_bias") || body["logit_bias"].is_null()) return std::nullopt;
  const json& bias = body["logit_bias"];
  if (!bias.is_object()) return WrongType("logit_bias", bias, "an object of token id -> bias");
  for (const auto& [key, value] : bias.items()) {
    char* end = nullptr;
    const long long id = std::strtoll(key.c_str(), &end, 10);
    if (key.empty() || *end != '\0' || id < 0 || id > INT32_MAX) {
      return InvalidField("logit_bias", fmt::format("logit_bias key \"{}\" is not a token id", key));
    }
    if (!value.is_number()) return WrongType(fmt::format("logit_bias[{}]", key), value, "a number");
    (*s.mutable_logit_bias())[static_cast<int32_t>(id)] = value.get<float>();
  }
  return std::nullopt;
}

// vLLM's allowed_token_ids: a list of token ids (range and count are the gateway's checks).
Error ParseAllowedTokenIds(const json& body, SamplingParams& s) {
  if (!body.contains("allowed_token_ids") || body["allowed_token_ids"].is_null()) return std::nullopt;
  const json& ids = body["allowed_token_ids"];
  if (!ids.is_array()) return WrongType("allowed_token_ids", ids, "a list of token ids");
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!ids[i].is_number_integer() || !FitsInt32(ids[i])) {
      return WrongType(fmt::format("allowed_token_ids[{}]", i), ids[i], "a token id (an integer)");
    }
    s.add_allowed_token_ids(ids[i].get<int32_t>());
  }
  return std::nullopt;
}

// Ferry's extension, vLLM's --speculative-config per request: {"method": "ngram" | "draft_model" | "none",
// "num_speculative_tokens": N}, both optional (the method's name is checked here, the range by the gateway).
Error ParseSpeculative(const json& body, SamplingParams& s) {
  if (!body.contains("speculative") || body["speculative"].is_null()) return std::nullopt;
  const json& spec = body["speculative"];
  if (!spec.is_object()) return WrongType("speculative", spec, "an object");
  for (const auto& [key, value] : spec.items()) {
    if (key != "method" && key != "num_speculative_tokens") {
      return InvalidField("speculative." + key, fmt::format("speculative.{} is not a field (method, "
                                                            "num_speculative_tokens)", key));
    }
  }
  // Read under their dotted names, so that an error names the field in full.
  const json flat = {{"speculative.method", spec.value("method", json())},
                     {"speculative.num_speculative_tokens", spec.value("num_speculative_tokens", json())}};
  std::optional<std::string> method;
  std::optional<int32_t> k;
  if (Error e = GetString(flat, "speculative.method", method)) return e;
  if (Error e = GetInt32(flat, "speculative.num_speculative_tokens", k)) return e;
  if (method) {
    const std::optional<SpeculativeMethod> m = ParseSpeculativeMethodName(*method);
    if (!m) {
      return InvalidField("speculative.method", fmt::format("speculative.method = \"{}\" must be \"ngram\", "
                                                            "\"draft_model\" or \"none\"", *method));
    }
    s.mutable_speculative()->set_method(ToProto(*m));  // "": kDefault, the server's
  }
  if (k) s.mutable_speculative()->set_num_speculative_tokens(*k);
  return std::nullopt;
}

Error ParseSampling(const json& body, std::string_view body_text, SamplingParams& s) {
  if (Error e = ParseSamplingFloats(body, s)) return e;
  std::optional<int32_t> max_tokens, top_k, min_tokens;
  std::optional<int64_t> seed;
  std::optional<bool> ignore_eos, include_stop;
  if (Error e = GetInt32(body, "max_tokens", max_tokens)) return e;
  if (Error e = GetInt32(body, "top_k", top_k)) return e;
  if (Error e = GetInt32(body, "min_tokens", min_tokens)) return e;
  if (Error e = GetInt(body, "seed", seed)) return e;
  if (Error e = GetBool(body, "ignore_eos", ignore_eos)) return e;
  if (Error e = GetBool(body, "include_stop_str_in_output", include_stop)) return e;
  if (include_stop) s.set_include_stop_str_in_output(*include_stop);
  std::optional<bool> skip_special;
  if (Error e = GetBool(body, "skip_special_tokens", skip_special)) return e;
  if (skip_special) s.set_skip_special_tokens(*skip_special);
  if (max_tokens) s.set_max_tokens(*max_tokens);
  if (top_k) s.set_top_k(*top_k == -1 ? 0 : *top_k);  // vLLM's "off" is -1
  if (seed) s.set_seed(static_cast<uint64_t>(*seed));
  if (ignore_eos) s.set_ignore_eos(*ignore_eos);
  if (min_tokens) s.set_min_tokens(*min_tokens);
  if (Error e = ParseLogitBias(body, s)) return e;
  if (Error e = ParseAllowedTokenIds(body, s)) return e;
  if (Error e = ParseSpeculative(body, s)) return e;
  if (Error e = ParseGuided(body, body_text, s)) return e;
  if (Error e = ParseStop(body, s)) return e;
  return ParseStopTokenIds(body, s);
}

// Fields that would change the output, which Ferry does not implement: refused rather than
// ignored, so a client never gets plain text where it asked for a tool call or a grammar. Values
// that ask for nothing (null, empty, "none", a best_of equal to n, a field's default) pass.
// response_format, guided_choice, guided_json, guided_regex, guided_grammar and structured_outputs
// are read, or refused, by ParseGuided.
Error RefuseUnsupported(const json& body) {
  if (Error e = RefuseUnservedFields(body, Endpoint::kCompletions)) return e;
  for (const char* key : {"functions", "function_call"}) {
    if (Asks(body, key)) {
      return InvalidField(key, fmt::format("{} is not supported{}", key,
                                           std::string_view(key).starts_with("function") ? " (use tools)" : ""));
    }
  }
  if (body.contains("best_of") && !body["best_of"].is_null() && body["best_of"] != body.value("n", json(1))) {
    return InvalidField("best_of", "best_of is not supported (n choices are: ask for n)");
  }
  return std::nullopt;
}

// Fields every generation request shares: model, stream, lane, timeout, sampling.
Error ParseCommon(const json& body, std::string_view body_text, OpenAiRequest& r) {
  if (!body.is_object()) return InvalidField("", "the request body must be a JSON object");
  if (Error e = RefuseUnsupported(body)) return e;
  std::optional<std::string> model, lane;
  std::optional<bool> stream;
  std::optional<int64_t> timeout_ms, n;
  if (Error e = GetString(body, "model", model)) return e;
  if (Error e = GetInt(body, "n", n)) return e;
  if (n && (*n < 1 || *n > kMaxChoices)) {
    return InvalidField("n", fmt::format("n = {} must be in [1, {}]", *n, kMaxChoices));
  }
  r.n = static_cast<int32_t>(n.value_or(1));
  if (Error e = GetString(body, "lane", lane)) return e;
  if (Error e = GetBool(body, "stream", stream)) return e;
  if (Error e = GetInt(body, "timeout_ms", timeout_ms)) return e;
  if (timeout_ms && *timeout_ms <= 0) {
    return InvalidField("timeout_ms", fmt::format("timeout_ms = {} must be > 0", *timeout_ms));
  }
  r.model = model.value_or("");
  if (lane) r.generate.set_lane(*lane);
  r.stream = stream.value_or(false);
  r.timeout_ms = timeout_ms;
  if (Error e = GetInt(body, "truncate_prompt_tokens", r.truncate_prompt_tokens)) return e;
  if (r.truncate_prompt_tokens && *r.truncate_prompt_tokens < 1 && *r.truncate_prompt_tokens != -1) {
    return InvalidField("truncate_prompt_tokens", fmt::format("truncate_prompt_tokens = {} must be -1 (max_model_len) "
                                                              "or at least 1", *r.truncate_prompt_tokens));
  }
  std::optional<int32_t> prompt_logprobs;  // vLLM's extra field
  if (Error e = GetInt32(body, "prompt_logprobs", prompt_logprobs)) return e;
  if (prompt_logprobs) {
    // As vLLM: the prompt's logprobs would have no place in a stream's chunks.
    if (r.stream) return InvalidField("prompt_logprobs", "prompt_logprobs is not available with stream = true");
    r.generate.mutable_sampling()->set_prompt_logprobs(*prompt_logprobs);
    r.return_prompt_logprobs = true;
  }
  if (body.contains("stream_options") && body["stream_options"].is_object()) {
    const json& options = body["stream_options"];
    r.include_usage = options.contains("include_usage") && options["include_usage"].is_boolean() &&
                      options["include_usage"].get<bool>();
  }
  return ParseSampling(body, body_text, *r.generate.mutable_sampling());
}

bool IsTokenList(const json& v) {
  if (!v.is_array() || v.empty()) return false;
  for (const json& x : v) {
    if (!x.is_number_integer()) return false;
  }
  return true;
}

// One prompt: a string or a non-empty list of token ids.
bool ParseOnePrompt(const json& prompt, ferry::v1::GenerateRequest& g) {
  if (prompt.is_string()) {
    g.set_text(prompt.get<std::string>());
    return true;
  }
  if (!IsTokenList(prompt)) return false;
  for (const json& id : prompt) g.mutable_token_ids()->add_ids(static_cast<int32_t>(id.get<int64_t>()));
  return true;
}

// Ids past int32 cannot be stored as token ids: refused here, naming the value, not wrapped.
Error CheckTokenIdRange(const json& prompt, const std::string& name) {
  if (!IsTokenList(prompt)) return std::nullopt;
  for (size_t i = 0; i < prompt.size(); ++i) {
    const json& id = prompt[i];
    if (!FitsInt32(id)) return InvalidField("prompt", fmt::format("{}[{}] = {} is not a token id", name, i, id.dump()));
  }
  return std::nullopt;
}

// A prompt, or a list of prompts (OpenAI's batch: strings or token lists).
Error ParsePrompt(const json& body, OpenAiRequest& r) {
  if (!body.contains("prompt") || body["prompt"].is_null()) return InvalidField("prompt", "prompt is required");
  const json& prompt = body["prompt"];
  if (Error e = CheckTokenIdRange(prompt, "prompt")) return e;
  ferry::v1::GenerateRequest one;
  if (ParseOnePrompt(prompt, one)) {
    r.prompts.push_back(std::move(one));
  } else if (prompt.is_array() && !prompt.empty() && (prompt[0].is_string() || prompt[0].is_array())) {
    if (prompt.size() > static_cast<size_t>(kMaxPrompts)) {
      return InvalidField("prompt", fmt::format("a batch of {} prompts exceeds the limit of {}", prompt.size(),
                                                kMaxPrompts));
    }
    for (size_t i = 0; i < prompt.size(); ++i) {
      ferry::v1::GenerateRequest p;
      if (Error e = CheckTokenIdRange(prompt[i], fmt::format("prompt[{}]", i))) return e;
      if (!ParseOnePrompt(prompt[i], p)) {
        return WrongType(fmt::format("prompt[{}]", i), prompt[i], "a string or a non-empty list of token ids");
      }
      r.prompts.push_back(std::move(p));
    }
  } else {
    return WrongType("prompt", prompt, "a string, a non-empty list of token ids, or a list of those");
  }
  r.generate.MergeFrom(r.prompts.front());
  return std::nullopt;
}

std::variant<ChatMessage, ApiError> ParseMessage(const json& m, size_t i) {
  const std::string where = fmt::format("messages[{}]", i);
  if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
    return InvalidField("messages", where + " must be an object with a string role");
  }
  ChatMessage out{m["role"].get<std::string>(), "", {}, ""};
  if (out.role != "system" && out.role != "user" && out.role != "assistant" && out.role != "tool") {
    return InvalidField("messages", fmt::format("{}.role = \"{}\" is not supported (system, user, assistant, tool)",
                                                 where, out.role));
  }
  if (out.role == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null()) {
    if (Error e = ParseHistoryToolCalls(m["tool_calls"], where, out)) return *e;
  }
  if (out.role == "tool" && m.contains("tool_call_id") && !m["tool_call_id"].is_null()) {
    if (!m["tool_call_id"].is_string()) return InvalidField("messages", where + ".tool_call_id must be a string");
    out.tool_call_id = m["tool_call_id"].get<std::string>();
  }
  const json content = m.contains("content") ? m["content"] : json();
  if (content.is_string()) {
    out.content = content.get<std::string>();
  } else if (content.is_array()) {  // content parts: text only, joined as vLLM does
    for (const json& part : content) {
      const bool is_text = part.is_object() && part.contains("type") && part["type"] == "text" &&
                           part.contains("text") && part["text"].is_string();
      if (!is_text) {
        return InvalidField("messages", where + ".content: only parts of type \"text\" are supported");
      }
      out.content += (out.content.empty() ? "" : "\n") + part["text"].get<std::string>();
    }
  } else if (!(content.is_null() && out.role == "assistant")) {
    return InvalidField("messages", where + ".content must be a string or a list of text parts");
  }
  return out;
}

// logprobs (bool) and top_logprobs (0..20) in chat style become sampling.logprobs.
Error ParseChatLogprobs(const json& body, SamplingParams& s) {
  std::optional<bool> logprobs;
  std::optional<int32_t> top;
  if (Error e = GetBool(body, "logprobs", logprobs)) return e;
  if (Error e = GetInt32(body, "top_logprobs", top)) return e;
  if (top && !logprobs.value_or(false)) return InvalidField("top_logprobs", "top_logprobs requires logprobs: true");
  if (logprobs.value_or(false)) s.set_logprobs(top.value_or(0));
  return std::nullopt;
}

// messages and how the prompt ends (add_generation_prompt, continue_final_message).
Error ReadChatConversation(const json& body, std::vector<ChatMessage>& messages, ChatEnding& ending) {
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty()) {
    return InvalidField("messages", "messages must be a non-empty list");
  }
  std::optional<bool> add_generation_prompt, continue_final_message;
  if (Error e = GetBool(body, "add_generation_prompt", add_generation_prompt)) return e;
  if (Error e = GetBool(body, "continue_final_message", continue_final_message)) return e;
  ending.continue_final_message = continue_final_message.value_or(false);
  // As vLLM: continuing the last message opens no new turn, and both at once is a contradiction.
  ending.add_generation_prompt = add_generation_prompt.value_or(!ending.continue_final_message);
  if (ending.add_generation_prompt && ending.continue_final_message) {
    return InvalidField("continue_final_message", "continue_final_message and add_generation_prompt cannot both be "
                                                  "true: the last message is continued, or a new turn is opened");
  }
  for (size_t i = 0; i < body["messages"].size(); ++i) {
    auto m = ParseMessage(body["messages"][i], i);
    if (auto* e = std::get_if<ApiError>(&m)) return *e;
    messages.push_back(std::move(std::get<ChatMessage>(m)));
  }
  return std::nullopt;
}

// chat_template_kwargs (vLLM's extra): more variables for the template (enable_thinking, ...), in
// the client's key order; the ones the request itself sets are refused.
Error ReadTemplateKwargs(const json& body, std::string_view body_text, ordered_json& out) {
  if (!body.contains("chat_template_kwargs") || body["chat_template_kwargs"].is_null()) return std::nullopt;
  if (!body["chat_template_kwargs"].is_object()) {
    return InvalidField("chat_template_kwargs", fmt::format("chat_template_kwargs must be an object, got {}",
                                                            Brief(body["chat_template_kwargs"])));
  }
  ordered_json ordered = ordered_json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (ordered.is_discarded() || !ordered.is_object()) ordered = ordered_json::parse(body.dump());
  out = ordered["chat_template_kwargs"];
  for (const char* key : {"messages", "tools", "documents", "add_generation_prompt"}) {
    if (out.contains(key)) {
      return InvalidField("chat_template_kwargs", fmt::format("chat_template_kwargs.{} is set by the request itself "
                                                              "(its own field), not as a template argument", key));
    }
  }
  return std::nullopt;
}

// tools, tool_choice and parallel_tool_calls (tool_calls.h), read from the body in its own key
// order: tools are rendered, and schemas generated, in the client's order.
Error ReadChatToolFields(const json& body, std::string_view body_text, ToolsSpec& out) {
  if (!Asks(body, "tools") && !Asks(body, "tool_choice")) return std::nullopt;
  ordered_json ordered = ordered_json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (ordered.is_discarded() || !ordered.is_object()) ordered = ordered_json::parse(body.dump());
  auto tools = ReadChatTools(ordered);
  if (auto* e = std::get_if<ApiError>(&tools)) return *e;
  out = std::move(std::get<ToolsSpec>(tools));
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> WrongType(const std::string& param, const json& v, const std::string& want) {
  return InvalidField(param, fmt::format("{} must be {}, got {} ({})", param, want, v.type_name(), Brief(v)));
}

bool Asks(const json& body, const char* key) {
  if (!body.contains(key)) return false;
  const json& v = body[key];
  return !(v.is_null() || ((v.is_object() || v.is_array() || v.is_string()) && v.empty()));
}

ApiError InvalidField(const std::string& param, const std::string& message) {
  ApiError e;
  e.message = message;
  e.param = param;
  return e;
}

bool NestsDeeperThan(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;  // the escaped character cannot end the string
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

namespace {

constexpr size_t kBriefChars = 48;  // of a string
constexpr size_t kBriefItems = 4;   // of an array or object

// Cuts a UTF-8 string at a character boundary at or before `bytes`.
std::string CutUtf8(const std::string& s, size_t bytes) {
  if (s.size() <= bytes) return s;
  while (bytes > 0 && (static_cast<unsigned char>(s[bytes]) & 0xC0) == 0x80) --bytes;
  return s.substr(0, bytes) + "...";
}

std::string BriefAt(const json& v, int depth) {
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    return json(CutUtf8(s, kBriefChars)).dump(-1, ' ', false, json::error_handler_t::replace);
  }
  if (!v.is_structured()) return v.dump();
  const bool is_array = v.is_array();
  if (v.empty()) return is_array ? "[]" : "{}";
  if (depth >= 2) return is_array ? "[...]" : "{...}";
  std::string out = is_array ? "[" : "{";
  size_t i = 0;
  for (auto it = v.begin(); it != v.end(); ++it, ++i) {
    if (i == kBriefItems) {
      out += fmt::format(", ... ({} in all)", v.size());
      break;
    }
    if (i > 0) out += ", ";
    if (!is_array) out += BriefAt(json(it.key()), depth + 1) + ": ";
    out += BriefAt(*it, depth + 1);
  }
  return out + (is_array ? "]" : "}");
}

}  // namespace

std::string Brief(const json& value) { return BriefAt(value, 0); }

json ErrorJson(const ApiError& e) {
  json error = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) error["param"] = e.param;
  if (!e.code.empty()) error["code"] = e.code;
  return json{{"error", error}};
}

ApiError ErrorFromStatus(const Status& status, ParamName param_name) {
  ApiError e;
  e.message = status.error_message();
  switch (status.error_code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      e.param = ParamFromMessage(e.message);
      if (param_name != nullptr && !e.param.empty()) e.param = param_name(e.param);
      return e;
    case StatusCode::kAlreadyExists: e.http_status = 400; break;  // a LoRA adapter loaded twice (vLLM's 400)
    case StatusCode::kNotFound: e.http_status = 404; break;       // a LoRA adapter not served
    case StatusCode::kUnauthenticated: e.http_status = 401; e.type = "authentication_error"; break;
    case StatusCode::kPermissionDenied: e.http_status = 403; e.type = "permission_error"; break;
    case StatusCode::kResourceExhausted:
      e.http_status = 429;
      e.type = "rate_limit_error";
      e.retry_after_s = 1;
      break;
    case StatusCode::kDeadlineExceeded:
      if (status.queue_timeout()) {  // overload, as a full lane: never started, retryable
        e.http_status = 429;
        e.type = "rate_limit_error";
        e.retry_after_s = 1;
        break;
      }
      e.http_status = 504;
      e.type = "timeout";
      break;
    case StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "service_unavailable";
      e.retry_after_s = 1;
      break;
    case StatusCode::kCancelled: e.http_status = 499; e.type = "cancelled"; break;
    default: e.http_status = 500; e.type = "internal_error"; break;
  }
  // Retry-After counts whole seconds: a hint is rounded up, never to 0.
  if (e.retry_after_s > 0 && status.retry_after_ms() > 0) e.retry_after_s = (status.retry_after_ms() + 999) / 1000;
  e.code = std::to_string(e.http_status);
  return e;
}

std::variant<OpenAiRequest, ApiError> ParseCompletionRequest(const json& body, std::string_view body_text) {
  OpenAiRequest r;
  r.endpoint = Endpoint::kCompletions;
  if (Error e = ParseCommon(body, body_text, r)) return *e;
  if (Error e = ParsePrompt(body, r)) return *e;
  std::optional<int32_t> logprobs;
  std::optional<bool> echo;
  if (Error e = GetInt32(body, "logprobs", logprobs)) return *e;
  if (Error e = GetBool(body, "echo", echo)) return *e;
  if (body.contains("suffix") && !body["suffix"].is_null()) return InvalidField("suffix", "suffix is not supported");
  for (const char* key : {"tools", "tool_choice"}) {
    if (Asks(body, key) && body[key] != "none") {
      return InvalidField(key, fmt::format("{} is served by /v1/chat/completions, not /v1/completions", key));
    }
  }
  if (logprobs) r.generate.mutable_sampling()->set_logprobs(*logprobs);
  std::optional<bool> add_special_tokens;  // vLLM's extra; absent: true (the proto's default)
  if (Error e = GetBool(body, "add_special_tokens", add_special_tokens)) return *e;
  if (add_special_tokens) r.generate.set_add_special_tokens(*add_special_tokens);
  r.echo = echo.value_or(false);
  if (r.echo) {
    // The prompt's logprobs come with the same number of alternatives as the completion's.
    auto& s = *r.generate.mutable_sampling();
    if (logprobs && s.has_prompt_logprobs() && s.prompt_logprobs() != *logprobs) {
      return InvalidField("prompt_logprobs", fmt::format("prompt_logprobs = {} must equal logprobs = {} when echo is set",
                                                         s.prompt_logprobs(), *logprobs));
    }
    if (logprobs) s.set_prompt_logprobs(*logprobs);
    for (const auto& p : r.prompts) r.echo_texts.push_back(p.has_text() ? p.text() : std::string());
  }
  return r;
}

std::variant<OpenAiRequest, ApiError> ParseChatRequest(const json& body, const ChatTemplate& chat,
                                                       std::string_view body_text) {
  ChatRequest c;
  OpenAiRequest& r = c.request;
  r.endpoint = Endpoint::kChat;
  if (Error e = ParseCommon(body, body_text, r)) return *e;
  if (Error e = RefuseUnservedFields(body, Endpoint::kChat)) return *e;
  auto& s = *r.generate.mutable_sampling();
  std::optional<int32_t> max_completion_tokens;
  if (Error e = GetInt32(body, "max_completion_tokens", max_completion_tokens)) return *e;
  if (max_completion_tokens && !s.has_max_tokens()) s.set_max_tokens(*max_completion_tokens);
  r.is_max_tokens_set = s.has_max_tokens();
  if (Error e = ParseChatLogprobs(body, s)) return *e;
  // vLLM's extra, false by default on chat: the template writes the special tokens itself.
  std::optional<bool> add_special_tokens;
  if (Error e = GetBool(body, "add_special_tokens", add_special_tokens)) return *e;
  r.generate.set_add_special_tokens(add_special_tokens.value_or(false));
  if (Error e = ReadChatConversation(body, c.messages, c.ending)) return *e;
  if (Error e = ReadChatToolFields(body, body_text, c.tools)) return *e;
  if (Error e = ReadTemplateKwargs(body, body_text, c.template_kwargs)) return *e;
  return BuildChatGeneration(std::move(c), chat);
}

std::variant<std::string, ApiError> RenderChatPrompt(const json& body, std::string_view body_text,
                                                     const ChatTemplate& chat, const std::vector<ordered_json>& tools) {
  std::vector<ChatMessage> messages;
  ChatEnding ending;
  if (Error e = ReadChatConversation(body, messages, ending)) return *e;
  if (!chat.is_supported()) return InvalidField("messages", chat.unsupported_reason());
  ordered_json kwargs;
  if (Error e = ReadTemplateKwargs(body, body_text, kwargs)) return *e;
  auto prompt = chat.Render(messages, tools, ending, kwargs);
  if (auto* e = std::get_if<ChatTemplateError>(&prompt)) {
    return InvalidField("messages", "the model's chat template refused the conversation: " + e->message);
  }
  return std::move(std::get<std::string>(prompt));
}

std::vector<ferry::v1::GenerateRequest> ExpandChoices(const OpenAiRequest& r) {
  std::vector<ferry::v1::GenerateRequest> choices;
  const uint64_t seed = r.generate.sampling().seed();
  for (const ferry::v1::GenerateRequest& prompt : r.prompts) {
    for (int32_t i = 0; i < r.n; ++i) {
      ferry::v1::GenerateRequest& c = choices.emplace_back(r.generate);
      c.clear_text();
      c.clear_token_ids();
      c.MergeFrom(prompt);
      if (seed != 0) c.mutable_sampling()->set_seed(seed + static_cast<uint64_t>(i));
      // Each choice is a request of its own at the scheduler: its own key.
      if (!c.idempotency_key().empty()) c.set_idempotency_key(fmt::format("{}#{}", c.idempotency_key(), choices.size() - 1));
    }
  }
  return choices;
}

}  // namespace ferry::gateway::http
