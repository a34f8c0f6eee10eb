#include "gateway/http/tool_calls.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <random>

#include "structured/json_schema.h"
#include "gateway/http/openai_format.h"

namespace ferry::gateway::http {
namespace {

using ordered_json = nlohmann::ordered_json;

constexpr std::string_view kOpenTag = "<tool_call>";
constexpr std::string_view kCloseTag = "</tool_call>";
// OpenAI's limits: 128 tools, names of 1-64 letters, digits, '_' or '-'.
constexpr size_t kMaxTools = 128;
constexpr size_t kMaxNameBytes = 64;

void DumpTo(const ordered_json& v, std::string& out) {
  if (v.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [key, item] : v.items()) {
      if (!first) out += ", ";
      first = false;
      out += ordered_json(key).dump();
      out += ": ";
      DumpTo(item, out);
    }
    out += '}';
  } else if (v.is_array()) {
    out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i > 0) out += ", ";
      DumpTo(v[i], out);
    }
    out += ']';
  } else {
    out += v.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
  }
}

std::string Brief(const ordered_json& v) { return http::Brief(nlohmann::json::parse(v.dump())); }

bool IsToolName(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameBytes) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

// The schema a call of `tool` is generated under: its parameters (none: any object).
ordered_json ParametersSchema(const ToolSpec& tool) {
  return tool.parameters.is_object() ? tool.parameters : ordered_json{{"type", "object"}};
}

// The named choice's schema: its parameters, checked as the worker will compile it.
std::optional<ApiError> NamedSchema(const std::vector<ToolSpec>& tools, ToolsRequest& out) {
  for (const ToolSpec& tool : tools) {
    if (tool.name != out.named) continue;
    out.named_schema = tool.parameters.is_object() ? tool.parameters.dump() : std::string(R"({"type": "object"})");
    try {
      CompileJsonSchemaCached(out.named_schema);
    } catch (const JsonSchemaError& e) {
      return InvalidField("tools", fmt::format("{}.parameters: {}", tool.field, e.what()));
    }
    return std::nullopt;
  }
  return InvalidField("tool_choice", fmt::format("tool_choice names function \"{}\", which is not in tools", out.named));
}

// tool_choice "required": vLLM's array of calls, each {"name": one tool's, "parameters": its
// schema's value}, told apart by the name (a tagged union); one call without parallel_tool_calls.
std::optional<ApiError> RequiredSchema(const std::vector<ToolSpec>& tools, ToolsRequest& out) {
  ordered_json alternatives = ordered_json::array();
  for (const ToolSpec& tool : tools) {
    alternatives.push_back({{"type", "object"},
                            {"properties", {{"name", {{"enum", ordered_json::array({tool.name})}}},
                                            {"parameters", ParametersSchema(tool)}}},
                            {"required", ordered_json::array({"name", "parameters"})},
                            {"additionalProperties", false}});
  }
  ordered_json schema = {{"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", alternatives}}}};
  if (!out.parallel) schema["maxItems"] = 1;
  out.named_schema = schema.dump();
  try {
    CompileJsonSchemaCached(out.named_schema);
  } catch (const JsonSchemaError& e) {
    return InvalidField("tools", fmt::format("tool_choice \"required\" generates the tools' parameters under their "
                                             "schemas: {}", e.what()));
  }
  return std::nullopt;
}

// {"name": string, "parameters": any}: one item of a "required" choice's array.
std::optional<ToolCall> CallFromItem(const ordered_json& item, ToolFormat format) {
  if (!item.is_object() || !item.contains("name") || !item["name"].is_string() || !item.contains("parameters")) {
    return std::nullopt;
  }
  return ToolCall{NewToolCallId(format), item["name"].get<std::string>(), PyJsonDumps(item["parameters"])};
}

// Chat's tool_choice: "none", "auto" (or null), "required" or {"type": "function", "function":
// {"name": N}}.
std::optional<ApiError> ReadChatChoice(const ordered_json& body, ToolsSpec& out) {
  const ordered_json choice = body.value("tool_choice", ordered_json());
  if (choice.is_null()) return std::nullopt;
  out.choice_text = Brief(choice);
  if (choice == "auto") return std::nullopt;
  if (choice == "none" || choice == "required") {
    out.choice = choice == "none" ? ToolsRequest::Choice::kNone : ToolsRequest::Choice::kRequired;
    return std::nullopt;
  }
  const bool named = choice.is_object() && choice.value("type", ordered_json()) == "function" &&
                     choice.contains("function") && choice["function"].is_object() &&
                     choice["function"].value("name", ordered_json()).is_string();
  if (!named) {
    return InvalidField("tool_choice", fmt::format("tool_choice = {} must be \"none\", \"auto\" or {{\"type\": "
                                                   "\"function\", \"function\": {{\"name\": ...}}}}", Brief(choice)));
  }
  out.choice = ToolsRequest::Choice::kNamed;
  out.named = choice["function"]["name"].get<std::string>();
  return std::nullopt;
}

// A block's JSON: {"name": string, "arguments": any}, as Hermes-style models write a call.
std::optional<ToolCall> CallFromBlock(std::string_view block) {
  const ordered_json call = ordered_json::parse(block, nullptr, /*allow_exceptions=*/false);
  if (!call.is_object() || !call.contains("name") || !call["name"].is_string() || !call.contains("arguments")) {
    return std::nullopt;
  }
  return ToolCall{NewToolCallId(), call["name"].get<std::string>(), PyJsonDumps(call["arguments"])};
}

nlohmann::json CallDelta(int32_t index, const ToolCall& call) {
  return {{"index", index},
          {"id", call.id},
          {"type", "function"},
          {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
}

// The length of text's longest suffix that begins `tag` (a tag that may be arriving).
size_t PartialTagSuffix(const std::string& text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (text.compare(text.size() - n, n, tag.substr(0, n)) == 0) return n;
  }
  return 0;
}

}  // namespace

std::optional<ApiError> ParseHistoryToolCalls(const nlohmann::json& calls, const std::string& where, ChatMessage& out) {
  if (!calls.is_array()) {
    return InvalidField("messages", fmt::format("{}.tool_calls must be a list of calls, got {}", where, http::Brief(calls)));
  }
  for (size_t k = 0; k < calls.size(); ++k) {
    const std::string at = fmt::format("{}.tool_calls[{}].function", where, k);
    const nlohmann::json& call = calls[k];
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
        !call["function"].contains("name") || !call["function"]["name"].is_string()) {
      return InvalidField("messages", at + " must be an object with a string name");
    }
    const nlohmann::json& f = call["function"];
    const nlohmann::json arguments = f.contains("arguments") ? f["arguments"] : nlohmann::json::object();
    std::optional<ordered_json> value =
        arguments.is_string() ? TemplateArguments(arguments.get<std::string>()) : ordered_json::parse(arguments.dump());
    if (!value) {
      return InvalidField("messages", fmt::format("{}.arguments = {} is not JSON", at, http::Brief(arguments)));
    }
    std::string id;
    if (call.contains("id") && call["id"].is_string()) id = call["id"].get<std::string>();
    out.tool_calls.push_back({std::move(id), f["name"].get<std::string>(), std::move(*value)});
  }
  return std::nullopt;
}

std::optional<ordered_json> TemplateArguments(const std::string& json_text) {
  ordered_json value = ordered_json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return std::nullopt;
  return value;
}

std::string PyJsonDumps(const ordered_json& value) {
  std::string out;
  DumpTo(value, out);
  return out;
}


std::variant<ToolSpec, ApiError> ReadToolFunction(const ordered_json& f, const std::string& field) {
  const ordered_json name = f.value("name", ordered_json());
  if (!name.is_string() || !IsToolName(name.get<std::string>())) {
    return InvalidField("tools", fmt::format("{}.name = {} must be a string of 1 to {} letters, digits, '_' or '-'",
                                             field, Brief(name), kMaxNameBytes));
  }
  if (f.contains("description") && !f["description"].is_string() && !f["description"].is_null()) {
    return InvalidField("tools", fmt::format("{}.description must be a string", field));
  }
  const ordered_json parameters = f.value("parameters", ordered_json());
  if (!parameters.is_object() && !parameters.is_null()) {
    return InvalidField("tools", fmt::format("{}.parameters = {} must be a JSON schema object", field,
                                             Brief(parameters)));
  }
  return ToolSpec{field, name.get<std::string>(), parameters, ""};
}

std::variant<ToolsSpec, ApiError> ReadChatTools(const ordered_json& body) {
  ToolsSpec out;
  if (auto e = ReadChatChoice(body, out)) return *e;
  const ordered_json tools = body.value("tools", ordered_json());
  if (tools.is_null() || (tools.is_array() && tools.empty())) return out;
  if (!tools.is_array()) {
    return InvalidField("tools", fmt::format("tools must be a list of {{\"type\": \"function\", ...}}, got {}",
                                             Brief(tools)));
  }
  // {"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}, rendered as given.
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& tool = tools[i];
    if (!tool.is_object() || tool.value("type", ordered_json()) != "function" || !tool.contains("function") ||
        !tool["function"].is_object()) {
      return InvalidField("tools", fmt::format("tools[{}] = {} must be {{\"type\": \"function\", \"function\": "
                                               "{{\"name\": ...}}}}", i, Brief(tool)));
    }
    auto spec = ReadToolFunction(tool["function"], fmt::format("tools[{}].function", i));
    if (auto* e = std::get_if<ApiError>(&spec)) return *e;
    out.tools.push_back(std::move(std::get<ToolSpec>(spec)));
    out.tools.back().tool = tool;
  }
  const ordered_json parallel = body.value("parallel_tool_calls", ordered_json());
  if (!parallel.is_null() && !parallel.is_boolean()) {
    return InvalidField("parallel_tool_calls", fmt::format("parallel_tool_calls must be a boolean, got {}", Brief(parallel)));
  }
  out.parallel = parallel.is_null() || parallel.get<bool>();
  return out;
}

std::variant<ToolsRequest, ApiError> BuildTools(const ToolsSpec& spec, bool template_has_tools, ToolFormat format) {
  ToolsRequest out;
  out.format = format;
  if (spec.tools.empty()) {
    if (spec.choice == ToolsRequest::Choice::kNamed || spec.choice == ToolsRequest::Choice::kRequired) {
      return InvalidField("tool_choice", fmt::format("tool_choice = {} needs tools", spec.choice_text));
    }
    return out;  // nothing offered: no tools section, nothing parsed
  }
  if (!template_has_tools) {
    return InvalidField("tools", "the model's chat template does not render tools (it never reads `tools`)");
  }
  if (spec.choice == ToolsRequest::Choice::kAuto && format == ToolFormat::kNone) {
    return InvalidField("tool_choice", "tool_choice \"auto\" (the default with tools) needs the format the model "
                                       "answers calls in, and the chat template's is none Ferry parses (hermes, "
                                       "llama3_json, mistral): start the gateway with --tool-call-parser, or ask for "
                                       "\"required\" or a named function");
  }
  if (spec.tools.size() > kMaxTools) {
    return InvalidField("tools", fmt::format("tools has {} entries, over the limit of {}", spec.tools.size(), kMaxTools));
  }
  for (const ToolSpec& tool : spec.tools) {
    if (std::find(out.names.begin(), out.names.end(), tool.name) != out.names.end()) {
      return InvalidField("tools", fmt::format("{}.name = \"{}\" is given twice", tool.field, tool.name));
    }
    out.names.push_back(tool.name);
    out.tools.push_back(tool.tool);
  }
  out.parallel = spec.parallel;
  out.choice = spec.choice;
  out.named = spec.named;
  if (out.choice == ToolsRequest::Choice::kNamed) {
    if (auto e = NamedSchema(spec.tools, out)) return *e;
  } else if (out.choice == ToolsRequest::Choice::kRequired) {
    if (auto e = RequiredSchema(spec.tools, out)) return *e;
  }
  return out;
}

std::variant<ToolsRequest, ApiError> ParseTools(const ordered_json& body, bool template_has_tools, ToolFormat format) {
  auto spec = ReadChatTools(body);
  if (auto* e = std::get_if<ApiError>(&spec)) return *e;
  return BuildTools(std::get<ToolsSpec>(spec), template_has_tools, format);
}

ParsedOutput ParseHermesOutput(const std::string& text, bool parallel) {
  const size_t first = text.find(kOpenTag);
  if (first == std::string::npos) return {text, {}};
  ParsedOutput out;
  for (size_t at = first; at != std::string::npos;) {
    const size_t body = at + kOpenTag.size();
    const size_t end = text.find(kCloseTag, body);
    std::optional<ToolCall> call =
        CallFromBlock(std::string_view(text).substr(body, end == std::string::npos ? std::string::npos : end - body));
    if (!call) return {text, {}};  // as vLLM's parser: then nothing is a call
    out.calls.push_back(std::move(*call));
    at = end == std::string::npos ? end : text.find(kOpenTag, end + kCloseTag.size());
  }
  if (!parallel) out.calls.resize(1);
  if (first > 0) out.content = text.substr(0, first);
  return out;
}

ParsedOutput NamedCallOutput(const std::string& name, const std::string& text, ToolFormat format) {
  return {std::nullopt, {ToolCall{NewToolCallId(format), name, text}}};
}

ParsedOutput ParseChoiceOutput(const ToolsRequest& tools, const std::string& text) {
  switch (tools.choice) {
    case ToolsRequest::Choice::kNamed: return NamedCallOutput(tools.named, text, tools.format);
    case ToolsRequest::Choice::kRequired: return RequiredOutput(text, tools.format);
    default: break;
  }
  switch (tools.format) {
    case ToolFormat::kLlama3Json: return ParseLlama3JsonOutput(text, tools.parallel);
    case ToolFormat::kMistral: return ParseMistralOutput(text, tools.parallel);
    default: return ParseHermesOutput(text, tools.parallel);
  }
}

ParsedOutput RequiredOutput(const std::string& text, ToolFormat format) {
  const ordered_json items = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!items.is_array()) return {text, {}};
  ParsedOutput out;
  for (const ordered_json& item : items) {
    std::optional<ToolCall> call = CallFromItem(item, format);
    if (!call) return {text, {}};
    out.calls.push_back(std::move(*call));
  }
  return out;
}

StreamToolCalls::StreamToolCalls(ToolsRequest::Choice choice, std::string named, bool parallel, ToolFormat format)
    : choice_(choice), named_(std::move(named)), parallel_(parallel), format_(format) {
  if (choice_ == ToolsRequest::Choice::kAuto && (format == ToolFormat::kLlama3Json || format == ToolFormat::kMistral)) {
    held_calls_.emplace(format, parallel);
  }
}

void StreamToolCalls::SendCalls(const std::vector<ToolCall>& calls, StreamDelta& out) {
  for (const ToolCall& call : calls) {
    if (out.tool_calls.is_null()) out.tool_calls = nlohmann::json::array();
    out.tool_calls.push_back(CallDelta(calls_++, call));
  }
}

StreamDelta StreamToolCalls::Feed(const std::string& text) {
  StreamDelta out;
  if (choice_ == ToolsRequest::Choice::kNone) {
    out.content = text;
    return out;
  }
  if (choice_ == ToolsRequest::Choice::kNamed) {
    if (text.empty()) return out;
    nlohmann::json delta = {{"index", 0}, {"function", {{"arguments", text}}}};
    if (named_id_.empty()) {
      named_id_ = NewToolCallId(format_);
      delta["id"] = named_id_;
      delta["type"] = "function";
      delta["function"]["name"] = named_;
    }
    out.tool_calls = nlohmann::json::array({delta});
    ++calls_;
    return out;
  }
  if (choice_ == ToolsRequest::Choice::kRequired) {
    FeedRequired(text, out);
    return out;
  }
  if (held_calls_) {
    out.content = held_calls_->Feed(text);
    return out;
  }
  held_ += text;
  for (;;) {
    if (in_call_) {
      const size_t end = held_.find(kCloseTag);
      if (end == std::string::npos) break;
      TakeCall(held_.substr(0, end), /*closed=*/true, out);
      held_.erase(0, end + kCloseTag.size());
      in_call_ = false;
      continue;
    }
    const size_t tag = held_.find(kOpenTag);
    // Text after the first call is not content (as the whole-text parser: content is what
    // precedes it).
    if (tag != std::string::npos) {
      if (!past_first_) out.content += held_.substr(0, tag);
      held_.erase(0, tag + kOpenTag.size());
      in_call_ = past_first_ = true;
      continue;
    }
    const size_t keep = PartialTagSuffix(held_, kOpenTag);
    if (!past_first_) out.content += held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    break;
  }
  return out;
}

StreamDelta StreamToolCalls::Finish() {
  StreamDelta out;
  if (choice_ != ToolsRequest::Choice::kAuto) return out;
  if (held_calls_) {
    ParsedOutput parsed = held_calls_->Finish();
    out.content = parsed.content.value_or("");
    SendCalls(parsed.calls, out);
    return out;
  }
  if (in_call_) {
    TakeCall(held_, /*closed=*/false, out);  // an unclosed block still counts, as in the whole-text parser
  } else if (!past_first_) {
    out.content = held_;
  }
  held_.clear();
  in_call_ = false;
  return out;
}

// The array's bytes: an item's text runs from the '{' that opens depth 2 to the '}' that closes
// it (strings skipped, so braces in them do not count); each whole item goes out as a call.
void StreamToolCalls::FeedRequired(const std::string& text, StreamDelta& out) {
  for (char c : text) {
    const int32_t before = depth_;
    if (in_string_) {
      if (escaped_) {
        escaped_ = false;
      } else if (c == '\\') {
        escaped_ = true;
      } else if (c == '"') {
        in_string_ = false;
      }
    } else if (c == '"') {
      in_string_ = true;
    } else if (c == '{' || c == '[') {
      ++depth_;
    } else if (c == '}' || c == ']') {
      --depth_;
    }
    if (before >= 2 || depth_ >= 2) item_ += c;
    if (before != 2 || depth_ != 1) continue;
    std::optional<ToolCall> call = CallFromItem(ordered_json::parse(item_, nullptr, /*allow_exceptions=*/false), format_);
    item_.clear();
    if (!call) continue;
    if (out.tool_calls.is_null()) out.tool_calls = nlohmann::json::array();
    out.tool_calls.push_back(CallDelta(calls_++, *call));
  }
}

void StreamToolCalls::TakeCall(const std::string& block, bool closed, StreamDelta& out) {
  std::optional<ToolCall> call = CallFromBlock(block);
  if (!call) {
    // Calls already sent cannot be taken back: a block that is not a call goes out as text.
    out.content += std::string(kOpenTag) + block + (closed ? std::string(kCloseTag) : std::string());
    return;
  }
  if (!parallel_ && calls_ > 0) return;
  if (out.tool_calls.is_null()) out.tool_calls = nlohmann::json::array();
  out.tool_calls.push_back(CallDelta(calls_++, *call));
}

}  // namespace ferry::gateway::http
