// Qwen2TokenizerConfigJson: the transformers-side companion of tokenizer.json.
#include <nlohmann/json.hpp>

#include <stdexcept>

#include "gateway/tokenizer/bpe_trainer.h"

namespace ferry::tokenizer {
namespace {

// Qwen2.5-Instruct's ChatML template (with its tool-calling branches).
constexpr std::string_view kQwen25ChatTemplate = R"JINJA({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)JINJA";

}  // namespace

std::string_view Qwen25ChatTemplate() { return kQwen25ChatTemplate; }

std::string Qwen2TokenizerConfigJson(std::string_view tokenizer_json, int64_t model_max_length) {
  using nlohmann::ordered_json;
  const ordered_json tokenizer = ordered_json::parse(tokenizer_json);
  ordered_json decoder = ordered_json::object();
  ordered_json additional = ordered_json::array();
  for (const ordered_json& token : tokenizer.at("added_tokens")) {
    const std::string content = token.at("content").get<std::string>();
    decoder[std::to_string(token.at("id").get<int64_t>())] = ordered_json{
        {"content", content},          {"lstrip", token.value("lstrip", false)},
        {"normalized", token.value("normalized", false)}, {"rstrip", token.value("rstrip", false)},
        {"single_word", token.value("single_word", false)}, {"special", token.value("special", true)}};
    // Qwen2.5 lists every special token but the pad token here.
    if (token.value("special", true) && content != "<|endoftext|>") additional.push_back(content);
  }
  ordered_json config{{"add_bos_token", false},
                      {"add_prefix_space", false},
                      {"added_tokens_decoder", std::move(decoder)},
                      {"additional_special_tokens", std::move(additional)},
                      {"bos_token", nullptr},
                      {"chat_template", std::string(kQwen25ChatTemplate)},
                      {"clean_up_tokenization_spaces", false},
                      {"eos_token", "<|im_end|>"},
                      {"errors", "replace"},
                      {"model_max_length", model_max_length},
                      {"pad_token", "<|endoftext|>"},
                      {"split_special_tokens", false},
                      {"tokenizer_class", "Qwen2Tokenizer"},
                      {"unk_token", nullptr}};
  return config.dump(2) + "\n";
}

}  // namespace ferry::tokenizer
