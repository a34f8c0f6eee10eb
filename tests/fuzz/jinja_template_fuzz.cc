// Chat templates (gateway/jinja) on any text: the input is a template, then NUL, then the
// variables as JSON (optional; a fixed conversation when absent or not an object). Parse gives a
// template or an Error naming a line; a template renders to text or an Error, never a crash, a
// hang, deep recursion or an allocation past -malloc_limit_mb: the engine's Limits (kept small
// here so that a hostile loop ends fast) bound steps, output, nesting, values and macro calls.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "gateway/jinja/template.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

const nlohmann::ordered_json& Conversation() {
  static const auto v = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi \u00e9"},
                 {"role": "assistant", "content": "", "tool_calls": [{"id": "abc123XYZ", "type": "function",
                   "function": {"name": "f", "arguments": {"x": [1, 2.5, null, true]}}}]},
                 {"role": "tool", "content": "ok", "tool_call_id": "abc123XYZ"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})");
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string source(input.substr(0, nul));
  ferry::gateway::jinja::Limits limits;
  limits.max_steps = 200'000;
  limits.max_output_bytes = 1 << 20;
  limits.values.max_bytes = 1 << 20;
  limits.values.max_items = 1 << 16;
  auto parsed = ferry::gateway::jinja::Template::Parse(source, limits);
  if (auto* e = std::get_if<ferry::gateway::jinja::Error>(&parsed)) {
    FUZZ_CHECK(!e->message.empty(), "a parse error without a message");
    return 0;
  }
  nlohmann::ordered_json vars = Conversation();
  if (nul != std::string_view::npos) {
    auto given = nlohmann::ordered_json::parse(input.substr(nul + 1), nullptr, /*allow_exceptions=*/false);
    if (given.is_object()) vars = std::move(given);
  }
  std::variant<std::string, ferry::gateway::jinja::Error> rendered;
  try {
    const auto value = ferry::gateway::jinja::Value::FromJson(vars);
    rendered = std::get<ferry::gateway::jinja::Template>(parsed).Render(value.dict());
  } catch (const ferry::gateway::jinja::Error& e) {  // variables nested past the engine's bound
    return 0;
  }
  if (auto* text = std::get_if<std::string>(&rendered)) {
    FUZZ_CHECK(text->size() <= limits.max_output_bytes, "output of %zu bytes", text->size());
  }
  return 0;
}
