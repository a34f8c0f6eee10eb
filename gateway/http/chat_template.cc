#include "gateway/http/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "gateway/jinja/strings.h"
#include "gateway/jinja/template.h"

namespace ferry::gateway::http {

namespace {

using jinja::Value;
using ordered_json = nlohmann::ordered_json;

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// transformers' special_tokens_map: the special tokens tokenizer_config.json sets, as strings (an
// AddedToken object gives its content); the ones it leaves null are not variables at all.
ordered_json SpecialTokens(const ordered_json& config) {
  ordered_json out = ordered_json::object();
  auto text = [](const ordered_json& t) -> std::optional<std::string> {
    if (t.is_string()) return t.get<std::string>();
    if (t.is_object() && t.contains("content") && t["content"].is_string()) return t["content"].get<std::string>();
    return std::nullopt;
  };
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (!config.contains(key)) continue;
    if (auto t = text(config[key])) out[key] = *t;
  }
  if (config.contains("additional_special_tokens") && config["additional_special_tokens"].is_array()) {
    ordered_json list = ordered_json::array();
    for (const auto& t : config["additional_special_tokens"]) {
      if (auto s = text(t)) list.push_back(*s);
    }
    if (!list.empty()) out["additional_special_tokens"] = std::move(list);
  }
  return out;
}

// A message as vLLM hands it to the template.
Value MessageValue(const ChatMessage& m) {
  jinja::Dict d;
  d.Set("role", Value::String(m.role));
  d.Set("content", Value::String(m.content));
  if (!m.tool_calls.empty()) {
    jinja::List calls;
    for (const ChatToolCall& c : m.tool_calls) {
      jinja::Dict function;
      function.Set("name", Value::String(c.name));
      function.Set("arguments", Value::FromJson(c.arguments));
      jinja::Dict call;
      if (!c.id.empty()) call.Set("id", Value::String(c.id));
      call.Set("type", Value::String("function"));
      call.Set("function", Value::MakeDict(std::move(function)));
      calls.push_back(Value::MakeDict(std::move(call)));
    }
    d.Set("tool_calls", Value::MakeList(std::move(calls)));
  }
  if (!m.tool_call_id.empty()) d.Set("tool_call_id", Value::String(m.tool_call_id));
  return Value::MakeDict(std::move(d));
}

// transformers' continue_final_message: the text up to the end of the last message's (stripped)
// content, without trailing whitespace.
std::variant<std::string, ChatTemplateError> CutAfterFinal(std::string rendered, const std::string& final_content) {
  const std::string final_text = jinja::PyStrip(final_content, std::nullopt, true, true);
  const size_t at = rendered.rfind(final_text);
  if (at == std::string::npos) {
    return ChatTemplateError{"continue_final_message: the chat template does not write the last message's content as "
                             "it is, so the model cannot continue it"};
  }
  rendered.resize(at + final_text.size());
  return jinja::PyStrip(rendered, std::nullopt, false, true);
}

}  // namespace

std::variant<ChatTemplate, std::string> ChatTemplate::Parse(
    const std::vector<std::pair<std::string, std::string>>& named, const ordered_json& special_tokens,
    const std::string& origin) {
  ChatTemplate t;
  t.special_tokens_ = special_tokens;
  for (const auto& [name, text] : named) {
    auto parsed = jinja::Template::Parse(text);
    if (auto* e = std::get_if<jinja::Error>(&parsed)) {
      return fmt::format("{}{}: line {}: {} (the template engine serves what jinja2 chat templates use; "
                         "gateway/jinja/README.md lists it)",
                         origin, name.empty() ? "" : " (template \"" + name + "\")", e->line, e->message);
    }
    t.templates_.push_back({name, std::make_shared<const jinja::Template>(std::move(std::get<jinja::Template>(parsed)))});
    t.has_tools_ = t.has_tools_ || text.find("tools") != std::string::npos;
    if (t.tool_format_ == ToolFormat::kNone) t.tool_format_ = ToolFormatOfTemplate(text);
  }
  return t;
}

ChatTemplate ChatTemplate::FromTemplateText(const std::string& template_text, const ordered_json& special_tokens) {
  auto parsed = Parse({{"", template_text}}, special_tokens, "the chat template");
  if (auto* t = std::get_if<ChatTemplate>(&parsed)) return std::move(*t);
  return Unavailable(std::get<std::string>(parsed));
}

std::variant<ChatTemplate, std::string> ChatTemplate::Load(const std::string& model_path,
                                                           const std::string& override_template) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // The model directory, or a file in it (tokenizer.json, tokenizer_config.json).
  const bool is_dir = fs::is_directory(model_path, ec);
  const fs::path dir = is_dir ? fs::path(model_path) : fs::path(model_path).parent_path();
  const std::string config_file = (dir / "tokenizer_config.json").string();
  ordered_json config = ordered_json::object();
  if (auto text = ReadFile(config_file)) {
    config = ordered_json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!config.is_object()) return config_file + " is not a JSON object";
  }
  const ordered_json special = SpecialTokens(config);
  if (!override_template.empty()) {
    if (fs::is_regular_file(override_template, ec)) {
      auto text = ReadFile(override_template);
      if (!text) return "--chat-template " + override_template + ": cannot be read";
      return Parse({{"", *text}}, special, "--chat-template " + override_template);
    }
    if (override_template.find("{{") == std::string::npos && override_template.find("{%") == std::string::npos) {
      return "--chat-template " + override_template + ": no such file, and not a template (no {{ or {%)";
    }
    return Parse({{"", override_template}}, special, "--chat-template (the text given)");
  }
  const std::string jinja_file = (dir / "chat_template.jinja").string();
  if (auto text = ReadFile(jinja_file)) return Parse({{"", *text}}, special, jinja_file);
  const ordered_json field = config.contains("chat_template") ? config["chat_template"] : ordered_json();
  if (field.is_string()) return Parse({{"", field.get<std::string>()}}, special, config_file + ": chat_template");
  if (field.is_array()) {  // named templates: [{"name", "template"}]
    std::vector<std::pair<std::string, std::string>> named;
    for (const auto& item : field) {
      if (!item.is_object() || !item.contains("name") || !item["name"].is_string() || !item.contains("template") ||
          !item["template"].is_string()) {
        return config_file + ": chat_template: each named template must be {\"name\": string, \"template\": string}";
      }
      named.emplace_back(item["name"].get<std::string>(), item["template"].get<std::string>());
    }
    std::stable_partition(named.begin(), named.end(), [](const auto& n) { return n.first == "default"; });
    return Parse(named, special, config_file + ": chat_template");
  }
  if (!field.is_null()) return config_file + ": chat_template must be a string or a list of named templates";
  return Unavailable("the model has no chat template (no chat_template in tokenizer_config.json, no "
                     "chat_template.jinja): use /v1/completions, or start the gateway with --chat-template FILE");
}

jinja::Dict ChatTemplate::Variables(const std::vector<ChatMessage>& messages, const std::vector<ordered_json>& tools,
                                    ChatEnding ending, const ordered_json& kwargs) const {
  jinja::Dict vars;
  for (const auto& [k, v] : special_tokens_.items()) vars.Set(k, Value::FromJson(v));
  if (kwargs.is_object()) {
    for (const auto& [k, v] : kwargs.items()) vars.Set(k, Value::FromJson(v));  // over the special tokens
  }
  jinja::List message_values;
  for (const ChatMessage& m : messages) message_values.push_back(MessageValue(m));
  vars.Set("messages", Value::MakeList(std::move(message_values)));
  if (tools.empty()) {
    vars.Set("tools", Value::None());
  } else {
    jinja::List tool_values;
    for (const ordered_json& t : tools) tool_values.push_back(Value::FromJson(t));
    vars.Set("tools", Value::MakeList(std::move(tool_values)));
  }
  vars.Set("documents", Value::None());
  vars.Set("add_generation_prompt", Value::Bool(ending.add_generation_prompt));
  return vars;
}

std::variant<std::string, ChatTemplateError> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                                  const std::vector<ordered_json>& tools,
                                                                  ChatEnding ending, const ordered_json& kwargs) const {
  // transformers: with tools, the template named "tool_use" when there is one, else "default".
  const jinja::Template* body = templates_.front().body.get();
  for (const Named& n : templates_) {
    if (!tools.empty() && n.name == "tool_use") body = n.body.get();
  }
  jinja::Dict vars;
  try {  // a value nested past jinja's bound (requests are checked to 64 levels before this)
    vars = Variables(messages, tools, ending, kwargs);
  } catch (const jinja::Error& e) {
    return ChatTemplateError{e.message};
  }
  auto rendered = body->Render(vars);

  if (auto* e = std::get_if<jinja::Error>(&rendered)) {
    return ChatTemplateError{e->line > 0 ? fmt::format("{} (chat template line {})", e->message, e->line) : e->message};
  }
  std::string text = std::move(std::get<std::string>(rendered));
  if (ending.continue_final_message && !messages.empty()) return CutAfterFinal(std::move(text), messages.back().content);
  return text;
}

}  // namespace ferry::gateway::http
