#include "gateway/http/tool_formats.h"

#include <fmt/format.h>

#include <random>

#include "gateway/http/tool_calls.h"

namespace ferry::gateway::http {

namespace {

using ordered_json = nlohmann::ordered_json;

constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralTag = "[TOOL_CALLS]";

// The index past the JSON object that starts at text[start] ('{'), strings skipped so that
// braces inside them do not count; npos when it does not close.
size_t ObjectEnd(std::string_view text, size_t start) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = start; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

// {"name": string, <args_key>: any} (Llama 3 writes "parameters", vLLM also takes "arguments").
std::optional<ToolCall> CallFromObject(const ordered_json& call, ToolFormat format) {
  if (!call.is_object() || !call.contains("name") || !call["name"].is_string()) return std::nullopt;
  const char* key = call.contains("arguments") ? "arguments" : call.contains("parameters") ? "parameters" : nullptr;
  if (key == nullptr) return std::nullopt;
  return ToolCall{NewToolCallId(format), call["name"].get<std::string>(), PyJsonDumps(call[key])};
}

size_t SkipSpace(std::string_view text, size_t i) {
  while (i < text.size() && (text[i] == ' ' || text[i] == '\n' || text[i] == '\t' || text[i] == '\r')) ++i;
  return i;
}

// The length of text's longest suffix that begins `tag`.
size_t PartialSuffix(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

std::optional<ToolFormat> ToolFormatFromName(std::string_view name) {
  if (name == "hermes") return ToolFormat::kHermes;
  if (name == "llama3_json") return ToolFormat::kLlama3Json;
  if (name == "mistral") return ToolFormat::kMistral;
  return std::nullopt;
}

const char* ToolFormatName(ToolFormat format) {
  switch (format) {
    case ToolFormat::kHermes: return "hermes";
    case ToolFormat::kLlama3Json: return "llama3_json";
    case ToolFormat::kMistral: return "mistral";
    case ToolFormat::kNone: return "none";
  }
  return "none";
}

ToolFormat ToolFormatOfTemplate(const std::string& text) {
  if (text.find("<tool_call>") != std::string::npos) return ToolFormat::kHermes;
  if (text.find("[TOOL_CALLS]") != std::string::npos) return ToolFormat::kMistral;
  // Llama 3.1/3.2: a past call is written {"name": ..., "parameters": ...} in an ipython turn.
  if (text.find("\"parameters\": ") != std::string::npos && text.find("<|start_header_id|>") != std::string::npos) {
    return ToolFormat::kLlama3Json;
  }
  return ToolFormat::kNone;
}

std::string NewToolCallId(ToolFormat format) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  if (format == ToolFormat::kMistral) {
    static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    std::string id(9, ' ');
    for (char& c : id) c = kAlnum[rng() % (sizeof kAlnum - 1)];
    return id;
  }
  return fmt::format("chatcmpl-tool-{:016x}{:016x}", rng(), rng());
}

ParsedOutput ParseLlama3JsonOutput(const std::string& text, bool parallel) {
  std::string_view rest(text);
  size_t at = SkipSpace(rest, 0);
  if (rest.substr(at, kPythonTag.size()) == kPythonTag) at = SkipSpace(rest, at + kPythonTag.size());
  if (at >= rest.size() || rest[at] != '{') return {text, {}};
  ParsedOutput out;
  while (at < rest.size()) {  // objects joined by "; " (vLLM's llama3_json)
    const size_t end = ObjectEnd(rest, at);
    if (end == std::string_view::npos) return {text, {}};
    auto call = CallFromObject(ordered_json::parse(rest.substr(at, end - at), nullptr, false), ToolFormat::kLlama3Json);
    if (!call) return {text, {}};
    out.calls.push_back(std::move(*call));
    at = SkipSpace(rest, end);
    if (at < rest.size() && rest[at] == ';') at = SkipSpace(rest, at + 1);
    if (at < rest.size() && rest[at] != '{') return {text, {}};
  }
  if (!parallel) out.calls.resize(1);
  return out;
}

ParsedOutput ParseMistralOutput(const std::string& text, bool parallel) {
  const size_t tag = text.find(kMistralTag);
  if (tag == std::string::npos) return {text, {}};
  std::string body = text.substr(tag + kMistralTag.size());
  for (size_t more; (more = body.find(kMistralTag)) != std::string::npos;) body.erase(more, kMistralTag.size());
  const ordered_json parsed = ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
  const ordered_json items = parsed.is_object() ? ordered_json::array({parsed}) : parsed;
  if (!items.is_array() || items.empty()) return {text, {}};
  ParsedOutput out;
  for (const ordered_json& item : items) {
    auto call = CallFromObject(item, ToolFormat::kMistral);
    if (!call) return {text, {}};
    out.calls.push_back(std::move(*call));
  }
  if (!parallel) out.calls.resize(1);
  if (tag > 0) out.content = text.substr(0, tag);
  return out;
}

std::string HeldToolCalls::Feed(const std::string& text) {
  held_ += text;
  if (calls_started_) return {};
  if (format_ == ToolFormat::kLlama3Json) {
    if (!decided_) {
      const size_t at = SkipSpace(held_, 0);
      if (at == held_.size()) return {};  // only whitespace yet
      const std::string_view head = std::string_view(held_).substr(at);
      if (head.size() < kPythonTag.size() && kPythonTag.substr(0, head.size()) == head) return {};  // maybe the tag
      decided_ = true;
      calls_started_ = head[0] == '{' || head.substr(0, kPythonTag.size()) == kPythonTag;
      if (calls_started_) return {};
    }
    return std::exchange(held_, {});
  }
  // mistral: content up to the tag, a possible partial tag held back.
  const size_t tag = held_.find(kMistralTag);
  if (tag != std::string::npos) {
    calls_started_ = true;
    std::string content = held_.substr(0, tag);
    held_.erase(0, tag);
    return content;
  }
  const size_t keep = PartialSuffix(held_, kMistralTag);
  std::string content = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return content;
}

ParsedOutput HeldToolCalls::Finish() {
  const std::string held = std::exchange(held_, {});
  if (!calls_started_) return {held, {}};
  ParsedOutput parsed = format_ == ToolFormat::kLlama3Json ? ParseLlama3JsonOutput(held, parallel_)
                                                           : ParseMistralOutput(held, parallel_);
  if (parsed.calls.empty()) return {held, {}};  // not calls after all: the held text is content
  parsed.content.reset();  // what preceded the calls already went out
  return parsed;
}

}  // namespace ferry::gateway::http
