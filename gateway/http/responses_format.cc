#include "gateway/http/responses_format.h"

#include <random>
#include <set>

#include <fmt/format.h>

#include "gateway/http/chat_request.h"
#include "gateway/http/guided_format.h"

namespace ferry::gateway::http {
namespace {

using ojson = nlohmann::ordered_json;

// Every field a Responses request may carry. The first group is translated; the rest are refused
// unless they ask for nothing (RefuseUnserved). lane and timeout_ms are Ferry's, as on chat.
const std::set<std::string>& KnownFields() {
  static const std::set<std::string> kFields = {
      "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools", "tool_choice",
      "parallel_tool_calls", "text", "stream", "store", "previous_response_id", "metadata", "user", "seed",
      "lane", "timeout_ms", "include", "reasoning", "background", "truncation", "top_logprobs", "service_tier"};
  return kFields;
}

std::optional<ApiError> RefuseUnserved(const ojson& body) {
  for (const auto& [key, value] : body.items()) {
    if (!KnownFields().count(key)) {
      return InvalidField(key, fmt::format("{} is not a field of the Responses API that Ferry serves", key));
    }
  }
  auto asks = [&](const char* key) { return body.contains(key) && !body[key].is_null(); };
  if (asks("include") && !(body["include"].is_array() && body["include"].empty())) {
    return InvalidField("include", "include is not supported (there is no reasoning, search or image output)");
  }
  if (asks("reasoning")) return InvalidField("reasoning", "reasoning is not supported (the model does not reason)");
  if (asks("background") && body["background"] != false) {
    return InvalidField("background", "background = true is not supported (use stream, or ferry.v1.Jobs)");
  }
  if (asks("truncation") && body["truncation"] != "disabled") {
    return InvalidField("truncation", "truncation must be \"disabled\" (a prompt past max_model_len is refused)");
  }
  if (asks("top_logprobs") && body["top_logprobs"] != 0) {
    return InvalidField("top_logprobs", "top_logprobs is not supported on /v1/responses (ask /v1/chat/completions)");
  }
  return std::nullopt;
}

// A message item's content: a string, or parts of type input_text / output_text, joined.
std::variant<std::string, ApiError> ItemText(const ojson& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return *WrongType(where, content, "a string or a list of text parts");
  std::string text;
  for (size_t k = 0; k < content.size(); ++k) {
    const ojson& part = content[k];
    const std::string at = fmt::format("{}[{}]", where, k);
    const std::string type = part.is_object() ? part.value("type", "") : "";
    if (type != "input_text" && type != "output_text") {
      return InvalidField(at + ".type", fmt::format("{}.type = {} is not supported (input_text or output_text)", at,
                                                    Brief(part.is_object() ? part.value("type", json()) : json())));
    }
    if (!part.contains("text") || !part["text"].is_string()) {
      return *WrongType(at + ".text", part.value("text", ojson()), "a string");
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

std::optional<ApiError> RequireString(const ojson& item, const char* key, const std::string& where) {
  if (!item.contains(key) || !item[key].is_string()) {
    return WrongType(fmt::format("{}.{}", where, key), item.contains(key) ? item[key] : ojson(), "a string");
  }
  return std::nullopt;
}

// One input item as chat messages appended to `out`; consecutive function calls (and the text
// before them) are one assistant turn, as a chat history has them.
std::optional<ApiError> AppendItem(const ojson& item, const std::string& where, std::vector<ChatMessage>& out) {
  if (!item.is_object()) return WrongType(where, item, "an object (a message or a function call item)");
  const std::string type = item.value("type", "message");
  if (type == "message") {
    if (auto e = RequireString(item, "role", where)) return e;
    std::string role = item["role"];
    if (role == "developer") role = "system";
    if (role != "user" && role != "system" && role != "assistant") {
      return InvalidField(where + ".role", fmt::format("{}.role = {} must be user, system, developer or assistant",
                                                       where, Brief(item["role"])));
    }
    auto text = ItemText(item.value("content", ojson()), where + ".content");
    if (auto* e = std::get_if<ApiError>(&text)) return *e;
    out.push_back({role, std::move(std::get<std::string>(text)), {}});
    return std::nullopt;
  }
  if (type == "function_call") {
    for (const char* key : {"call_id", "name", "arguments"}) {
      if (auto e = RequireString(item, key, where)) return e;
    }
    std::optional<ojson> arguments = TemplateArguments(item["arguments"].get<std::string>());
    if (!arguments) {
      return InvalidField(where + ".arguments", fmt::format("{}.arguments = {} is not JSON", where,
                                                            Brief(item["arguments"])));
    }
    if (out.empty() || out.back().role != "assistant") out.push_back({"assistant", "", {}});
    out.back().tool_calls.push_back({item["call_id"].get<std::string>(), item["name"].get<std::string>(), std::move(*arguments)});
    return std::nullopt;
  }
  if (type == "function_call_output") {
    if (auto e = RequireString(item, "call_id", where)) return e;
    auto text = ItemText(item.value("output", ojson()), where + ".output");
    if (auto* e = std::get_if<ApiError>(&text)) return *e;
    out.push_back({"tool", std::move(std::get<std::string>(text)), {}, item["call_id"].get<std::string>()});
    return std::nullopt;
  }
  return InvalidField(where + ".type", fmt::format("{}.type = {} is not supported (message, function_call or "
                                                   "function_call_output)",
                                                   where, Brief(item["type"])));
}

// instructions (a system message, not kept in the history), the previous response's history and
// the input items: the conversation, and the history a continuation of this response starts from.
std::optional<ApiError> ReadConversation(const ojson& in, const std::vector<ChatMessage>* previous,
                                         std::vector<ChatMessage>& messages, std::vector<ChatMessage>& history) {
  if (!in.contains("input")) return InvalidField("input", "input is required (a string or a list of items)");
  if (in.contains("instructions") && !in["instructions"].is_null()) {
    if (!in["instructions"].is_string()) return *WrongType("instructions", in["instructions"], "a string");
    messages.push_back({"system", in["instructions"].get<std::string>(), {}});
  }
  if (previous != nullptr) history = *previous;
  const size_t turn_start = history.size();
  const ojson& input = in["input"];
  if (input.is_string()) {
    history.push_back({"user", input.get<std::string>(), {}});
  } else if (input.is_array()) {
    std::vector<ChatMessage> turn;
    for (size_t i = 0; i < input.size(); ++i) {
      if (auto e = AppendItem(input[i], fmt::format("input[{}]", i), turn)) return e;
    }
    history.insert(history.end(), turn.begin(), turn.end());
  } else {
    return *WrongType("input", input, "a string or a list of items");
  }
  if (history.size() == turn_start) return InvalidField("input", "input must hold at least one item");
  messages.insert(messages.end(), history.begin(), history.end());
  return std::nullopt;
}

// Responses' function tools ({"type": "function", "name", "description", "parameters"}), rendered
// in chat's form (what the template knows), tool_choice and parallel_tool_calls.
std::optional<ApiError> ReadTools(const ojson& in, ToolsSpec& out) {
  if (in.contains("tools") && !in["tools"].is_null()) {
    const ojson& tools = in["tools"];
    if (!tools.is_array()) return *WrongType("tools", tools, "a list of function tools");
    for (size_t i = 0; i < tools.size(); ++i) {
      const ojson& t = tools[i];
      const std::string where = fmt::format("tools[{}]", i);
      if (!t.is_object() || t.value("type", "") != "function") {
        return InvalidField(where + ".type", fmt::format("{}.type = {} is not supported (function tools only)", where,
                                                         Brief(t.is_object() ? t.value("type", ojson()) : t)));
      }
      auto spec = ReadToolFunction(t, where);
      if (auto* e = std::get_if<ApiError>(&spec)) return *e;
      ojson function = {{"name", t["name"]}};
      if (t.contains("description")) function["description"] = t["description"];
      if (t.contains("parameters") && !t["parameters"].is_null()) function["parameters"] = t["parameters"];
      out.tools.push_back(std::move(std::get<ToolSpec>(spec)));
      out.tools.back().tool = ojson{{"type", "function"}, {"function", std::move(function)}};
    }
  }
  if (in.contains("tool_choice") && !in["tool_choice"].is_null()) {
    const ojson& choice = in["tool_choice"];
    out.choice_text = Brief(choice);
    if (choice == "auto" || choice == "none" || choice == "required") {
      out.choice = choice == "auto"   ? ToolsRequest::Choice::kAuto
                   : choice == "none" ? ToolsRequest::Choice::kNone
                                      : ToolsRequest::Choice::kRequired;
    } else if (choice.is_object() && choice.value("type", "") == "function" && choice.contains("name") &&
               choice["name"].is_string()) {
      out.choice = ToolsRequest::Choice::kNamed;
      out.named = choice["name"].get<std::string>();
    } else {
      return InvalidField("tool_choice", fmt::format("tool_choice = {} must be \"auto\", \"none\", \"required\" or "
                                                     "{{\"type\": \"function\", \"name\": ...}}", Brief(choice)));
    }
  }
  if (in.contains("parallel_tool_calls") && !in["parallel_tool_calls"].is_null()) {
    if (!in["parallel_tool_calls"].is_boolean()) {
      return *WrongType("parallel_tool_calls", in["parallel_tool_calls"], "a boolean");
    }
    out.parallel = in["parallel_tool_calls"].get<bool>();
  }
  return std::nullopt;
}

// text.format: plain text, any JSON object, or a value valid under a JSON schema.
std::optional<ApiError> ReadTextFormat(const ojson& text, ferry::v1::SamplingParams& s) {
  if (!text.is_object()) return *WrongType("text", text, "an object with a \"format\"");
  if (!text.contains("format") || text["format"].is_null()) return std::nullopt;
  const ojson& format = text["format"];
  const std::string type = format.is_object() ? format.value("type", "") : "";
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    s.mutable_guided()->set_json_object(true);
    return std::nullopt;
  }
  if (type != "json_schema") {
    return InvalidField("text.format.type", fmt::format("text.format.type = {} must be text, json_object or json_schema",
                                                        Brief(format.is_object() ? format.value("type", ojson()) : format)));
  }
  if (!format.contains("schema")) {
    return InvalidField("text.format.schema", "text.format.schema is required with type \"json_schema\" (a JSON "
                                              "schema: an object or a boolean)");
  }
  const ojson& schema = format["schema"];
  if (!schema.is_object() && !schema.is_boolean()) {
    return *WrongType("text.format.schema", schema, "a JSON schema (an object or a boolean)");
  }
  if (format.contains("strict") && !format["strict"].is_null() && !format["strict"].is_boolean()) {
    return *WrongType("text.format.strict", format["strict"], "a boolean");
  }
  const std::string schema_text = schema.dump();  // keys in the client's order: properties are generated in it
  if (auto e = CheckJsonSchemaText(schema_text, "text.format", "text.format.schema")) return e;
  s.mutable_guided()->set_json_schema(schema_text);
  return std::nullopt;
}

// The Responses name of a field a later check refuses (the Generator's validation, which names the
// ferry.v1 field; ParamFromMessage gives its chat name): the request sets only these.
std::string ResponsesParam(const std::string& chat_param) {
  if (chat_param == "max_tokens") return "max_output_tokens";
  if (chat_param == "prompt") return "input";  // the prompt is the conversation
  return chat_param;  // temperature, top_p, seed, lane and timeout_ms are named alike
}

// model, max_output_tokens, temperature, top_p, seed, stream, lane, timeout_ms and user.
std::optional<ApiError> ReadSettings(const json& body, OpenAiRequest& r) {
  std::optional<std::string> model, lane, user;
  std::optional<double> temperature, top_p;
  std::optional<int64_t> seed, timeout_ms;
  std::optional<int32_t> max_output_tokens;
  std::optional<bool> stream;
  for (auto [key, out] : {std::pair{"model", &model}, {"lane", &lane}, {"user", &user}}) {
    if (auto e = GetString(body, key, *out)) return e;
  }
  if (auto e = GetNumber(body, "temperature", temperature)) return e;
  if (auto e = GetNumber(body, "top_p", top_p)) return e;
  if (auto e = GetInt(body, "seed", seed)) return e;
  if (auto e = GetInt(body, "timeout_ms", timeout_ms)) return e;
  if (auto e = GetInt32(body, "max_output_tokens", max_output_tokens)) return e;
  if (auto e = GetBool(body, "stream", stream)) return e;
  if (max_output_tokens && *max_output_tokens < 1) {
    return InvalidField("max_output_tokens", fmt::format("max_output_tokens = {} must be >= 1", *max_output_tokens));
  }
  if (timeout_ms && *timeout_ms <= 0) {
    return InvalidField("timeout_ms", fmt::format("timeout_ms = {} must be > 0", *timeout_ms));
  }
  auto& sampling = *r.generate.mutable_sampling();
  if (temperature) sampling.set_temperature(static_cast<float>(*temperature));
  if (top_p) sampling.set_top_p(static_cast<float>(*top_p));
  if (seed) sampling.set_seed(static_cast<uint64_t>(*seed));
  if (max_output_tokens) sampling.set_max_tokens(*max_output_tokens);
  r.is_max_tokens_set = max_output_tokens.has_value();
  r.model = model.value_or("");
  if (lane) r.generate.set_lane(*lane);
  r.stream = stream.value_or(false);
  r.timeout_ms = timeout_ms;
  return std::nullopt;
}

// The settings a Response object repeats, OpenAI's defaults where the request left them.
json Echo(const ojson& body, bool store) {
  auto get = [&](const char* key, json fallback) {
    return body.contains(key) && !body[key].is_null() ? json::parse(body[key].dump()) : fallback;
  };
  return {{"instructions", get("instructions", nullptr)},
          {"max_output_tokens", get("max_output_tokens", nullptr)},
          {"temperature", get("temperature", 1.0)},
          {"top_p", get("top_p", 1.0)},
          {"tools", get("tools", json::array())},
          {"tool_choice", get("tool_choice", "auto")},
          {"parallel_tool_calls", get("parallel_tool_calls", true)},
          {"text", get("text", json{{"format", {{"type", "text"}}}})},
          {"metadata", get("metadata", json::object())},
          {"previous_response_id", get("previous_response_id", nullptr)},
          {"user", get("user", nullptr)},
          {"store", store},
          {"truncation", "disabled"},
          {"background", false},
          {"reasoning", nullptr}};
}

json UsageJson(const ferry::v1::Usage& u) {
  return {{"input_tokens", u.prompt_tokens()},
          {"input_tokens_details", {{"cached_tokens", u.cached_tokens()}}},
          {"output_tokens", u.completion_tokens()},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", u.prompt_tokens() + u.completion_tokens()}};
}

json MessageItem(const std::string& id, const std::string& text, const char* status) {
  json content = json::array();
  if (std::string_view(status) == "completed") {
    content.push_back({{"type", "output_text"}, {"text", text}, {"annotations", json::array()},
                       {"logprobs", json::array()}});
  }
  return {{"type", "message"}, {"id", id}, {"status", status}, {"role", "assistant"}, {"content", content}};
}

json CallItem(const std::string& item_id, const ToolCall& call, const char* status) {
  return {{"type", "function_call"}, {"id", item_id}, {"call_id", call.id}, {"name", call.name},
          {"arguments", call.arguments}, {"status", status}};
}

}  // namespace

std::string NewResponsesId(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}_{:016x}{:08x}", prefix, rng(), static_cast<uint32_t>(rng()));
}

std::variant<ResponsesRequest, ApiError> ParseResponsesRequest(const json& body, std::string_view body_text,
                                                               const ChatTemplate& chat,
                                                               const std::vector<ChatMessage>* previous) {
  if (!body.is_object()) return InvalidField("", "the request body must be a JSON object");
  const ojson in = body_text.empty() ? ojson::parse(body.dump()) : ojson::parse(body_text);
  if (auto e = RefuseUnserved(in)) return *e;
  ResponsesRequest out;
  ChatRequest c;
  c.request.endpoint = Endpoint::kChat;  // one choice: "n" is refused above, as unknown
  c.messages_field = "input";
  c.request.param_name = ResponsesParam;
  c.request.generate.set_add_special_tokens(false);  // the chat template writes them
  if (auto e = ReadConversation(in, previous, c.messages, out.history)) return *e;
  if (auto e = ReadSettings(body, c.request)) return *e;
  if (auto e = ReadTools(in, c.tools)) return *e;
  if (in.contains("text") && !in["text"].is_null()) {
    if (auto e = ReadTextFormat(in["text"], *c.request.generate.mutable_sampling())) return *e;
  }
  if (in.contains("store") && !in["store"].is_null()) {
    if (!in["store"].is_boolean()) return *WrongType("store", in["store"], "a boolean");
    out.store = in["store"].get<bool>();
  }
  if (in.contains("metadata") && !in["metadata"].is_null() && !in["metadata"].is_object()) {
    return *WrongType("metadata", in["metadata"], "an object of strings");
  }
  auto built = BuildChatGeneration(std::move(c), chat);
  if (auto* e = std::get_if<ApiError>(&built)) return *e;
  out.chat = std::move(std::get<OpenAiRequest>(built));
  out.echo = Echo(in, out.store);
  return out;
}

ResponsesResult ResultFromGeneration(const ferry::v1::GenerateResponse& response, const ToolsRequest& tools) {
  ResponsesResult r;
  r.finish = response.finish_reason();
  r.usage = response.usage();
  std::optional<std::string> text = response.text();
  if (tools.active() && tools.choice != ToolsRequest::Choice::kNone) {
    ParsedOutput parsed = ParseChoiceOutput(tools, *text);
    text = parsed.content;
    r.calls = std::move(parsed.calls);
  }
  if (text && (!text->empty() || r.calls.empty())) {
    r.text = std::move(text);
    r.message_id = NewResponsesId("msg");
  }
  for (size_t i = 0; i < r.calls.size(); ++i) r.call_item_ids.push_back(NewResponsesId("fc"));
  return r;
}

json ResponseJson(const ResponsesIdentity& identity, const json& echo, const ResponsesResult* result,
                  const json& error) {
  json out = {{"id", identity.id}, {"object", "response"}, {"created_at", identity.created},
              {"model", identity.model}, {"status", "in_progress"}, {"error", error},
              {"incomplete_details", nullptr}, {"output", json::array()}, {"usage", nullptr}};
  out.update(echo);
  if (!error.is_null()) out["status"] = "failed";
  if (result == nullptr) return out;
  if (result->text) out["output"].push_back(MessageItem(result->message_id, *result->text, "completed"));
  for (size_t i = 0; i < result->calls.size(); ++i) {
    out["output"].push_back(CallItem(result->call_item_ids[i], result->calls[i], "completed"));
  }
  out["usage"] = UsageJson(result->usage);
  if (!error.is_null()) return out;
  const bool cut = result->finish == ferry::v1::FINISH_REASON_LENGTH && result->calls.empty();
  out["status"] = cut ? "incomplete" : "completed";
  if (cut) out["incomplete_details"] = {{"reason", "max_output_tokens"}};
  return out;
}

std::vector<ChatMessage> HistoryAfter(std::vector<ChatMessage> history, const ResponsesResult& result) {
  ChatMessage turn{"assistant", result.text.value_or(""), {}};
  for (const ToolCall& c : result.calls) {
    // A named call's arguments cut short by max_output_tokens are not JSON: the template writes
    // them as the string they are (what it writes for a string value).
    turn.tool_calls.push_back({c.id, c.name, TemplateArguments(c.arguments).value_or(ojson(c.arguments))});
  }
  history.push_back(std::move(turn));
  return history;
}

ResponsesStreamFormat::ResponsesStreamFormat(ResponsesIdentity identity, json echo,
                                             std::function<void(const json&, const ResponsesResult&)> on_complete)
    : identity_(std::move(identity)), echo_(std::move(echo)), on_complete_(std::move(on_complete)) {}

std::string ResponsesStreamFormat::Event(const std::string& type, json body) {
  body["type"] = type;
  body["sequence_number"] = sequence_++;
  return fmt::format("event: {}\ndata: {}\n\n", type, body.dump(-1, ' ', false, json::error_handler_t::replace));
}

void ResponsesStreamFormat::OpenMessage(std::string& out) {
  if (message_index_ >= 0) return;
  message_index_ = num_items_++;
  result_.message_id = NewResponsesId("msg");
  result_.text = "";
  out += Event("response.output_item.added",
               {{"output_index", message_index_}, {"item", MessageItem(result_.message_id, "", "in_progress")}});
  out += Event("response.content_part.added",
               {{"item_id", result_.message_id}, {"output_index", message_index_}, {"content_index", 0},
                {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}});
}

void ResponsesStreamFormat::CloseMessage(std::string& out) {
  if (message_index_ < 0) return;
  const json ids = {{"item_id", result_.message_id}, {"output_index", message_index_}, {"content_index", 0}};
  json done = ids;
  done["text"] = *result_.text;
  done["logprobs"] = json::array();
  out += Event("response.output_text.done", done);
  json part = ids;
  part["part"] = {{"type", "output_text"}, {"text", *result_.text}, {"annotations", json::array()}};
  out += Event("response.content_part.done", part);
  out += Event("response.output_item.done",
               {{"output_index", message_index_}, {"item", MessageItem(result_.message_id, *result_.text, "completed")}});
  message_index_ = -1;
}

// Chat's delta.tool_calls entries: one with an id starts a call; later ones with the same index
// carry more of its arguments.
void ResponsesStreamFormat::TakeCalls(const json& tool_calls, std::string& out) {
  for (const json& entry : tool_calls) {
    const size_t k = entry.value("index", size_t{0});
    const json function = entry.value("function", json::object());
    if (entry.contains("id")) {
      CloseMessage(out);
      if (call_of_index_.size() <= k) call_of_index_.resize(k + 1, -1);
      call_of_index_[k] = static_cast<int32_t>(result_.calls.size());
      result_.calls.push_back(ToolCall{entry["id"], function.value("name", ""), ""});
      result_.call_item_ids.push_back(NewResponsesId("fc"));
      call_output_index_.push_back(num_items_++);
      out += Event("response.output_item.added",
                   {{"output_index", call_output_index_.back()},
                    {"item", CallItem(result_.call_item_ids.back(), result_.calls.back(), "in_progress")}});
    }
    const std::string arguments = function.value("arguments", "");
    if (arguments.empty() || k >= call_of_index_.size() || call_of_index_[k] < 0) continue;
    const auto c = static_cast<size_t>(call_of_index_[k]);
    result_.calls[c].arguments += arguments;
    out += Event("response.function_call_arguments.delta",
                 {{"item_id", result_.call_item_ids[c]}, {"output_index", call_output_index_[c]}, {"delta", arguments}});
  }
}

std::string ResponsesStreamFormat::Chunk(int32_t, const ferry::v1::GenerateChunk& chunk, nlohmann::json tool_calls,
                                         bool) {
  std::string out;
  if (!is_started_) {
    is_started_ = true;
    const json created = ResponseJson(identity_, echo_, nullptr);
    out += Event("response.created", {{"response", created}});
    out += Event("response.in_progress", {{"response", created}});
  }
  if (!chunk.text().empty()) {
    OpenMessage(out);
    *result_.text += chunk.text();
    out += Event("response.output_text.delta", {{"item_id", result_.message_id}, {"output_index", message_index_},
                                                {"content_index", 0}, {"delta", chunk.text()},
                                                {"logprobs", json::array()}});
  }
  if (tool_calls.is_array()) TakeCalls(tool_calls, out);
  if (chunk.finish_reason() != ferry::v1::FINISH_REASON_UNSPECIFIED) {
    result_.finish = chunk.finish_reason();
    result_.usage = chunk.usage();
  }
  return out;
}

std::string ResponsesStreamFormat::End(const Status& status) {
  std::string out;
  CloseMessage(out);
  for (size_t i = 0; i < result_.calls.size(); ++i) {
    const int32_t index = call_output_index_[i];
    const ToolCall& call = result_.calls[i];
    out += Event("response.function_call_arguments.done",
                 {{"item_id", result_.call_item_ids[i]}, {"output_index", index}, {"arguments", call.arguments}});
    out += Event("response.output_item.done",
                 {{"output_index", index}, {"item", CallItem(result_.call_item_ids[i], call, "completed")}});
  }
  if (!status.ok() || result_.finish == ferry::v1::FINISH_REASON_TIMEOUT) {
    const ApiError e = status.ok() ? ApiError{504, "deadline reached while generating", "timeout"}
                                   : ErrorFromStatus(status);
    const json response = ResponseJson(identity_, echo_, &result_, {{"code", e.type}, {"message", e.message}});
    return out + Event("response.failed", {{"response", response}});
  }
  const json response = ResponseJson(identity_, echo_, &result_);
  if (on_complete_) on_complete_(response, result_);
  return out + Event(response["status"] == "incomplete" ? "response.incomplete" : "response.completed",
                     {{"response", response}});
}

}  // namespace ferry::gateway::http
