// The transformers-side companions of the tokenizer.json files bpe_trainer.h writes, each family's
// with its chat template.
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

// A Llama 3 style template, written for ferry-make-model's Llama-shaped models: the header-framed
// turns of Llama 3's format, tools offered in the system turn and called as one JSON object
// {"name", "parameters"} (the llama3_json tool parser), results in an "ipython" turn.
constexpr std::string_view kLlama3ChatTemplate = R"JINJA({{- bos_token }}
{%- if messages and messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_message = '' %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if tools or system_message %}
    {{- '<|start_header_id|>system<|end_header_id|>\n\n' }}
    {%- if tools %}
        {{- 'To call a function, reply with only a JSON object {"name": function name, "parameters": its arguments}. The functions:\n\n' }}
        {%- for tool in tools %}
            {{- tool | tojson(indent=4) + '\n\n' }}
        {%- endfor %}
    {%- endif %}
    {{- system_message + '<|eot_id|>' }}
{%- endif %}
{%- for message in loop_messages %}
    {%- if message['role'] == 'assistant' and message['tool_calls'] %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
        {%- for tool_call in message['tool_calls'] %}
            {%- set call = tool_call['function'] if tool_call['function'] is defined else tool_call %}
            {{- '{"name": "' + call['name'] + '", "parameters": ' + call['arguments'] | tojson + '}' }}
        {%- endfor %}
        {{- '<|eot_id|>' }}
    {%- elif message['role'] == 'tool' %}
        {{- '<|start_header_id|>ipython<|end_header_id|>\n\n' }}
        {%- if message['content'] is string %}
            {{- message['content'] }}
        {%- else %}
            {{- message['content'] | tojson }}
        {%- endif %}
        {{- '<|eot_id|>' }}
    {%- else %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)JINJA";

// A Mistral v0.3 style template, written for ferry-make-model's Mistral-shaped models: [INST]
// turns, the system message and the tools ([AVAILABLE_TOOLS]) before the last user turn, calls as
// [TOOL_CALLS] and a JSON list (the mistral tool parser), results as [TOOL_RESULTS].
constexpr std::string_view kMistralChatTemplate = R"JINJA({%- if messages and messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_message = '' %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- set ns = namespace(last_user=-1) %}
{%- for message in loop_messages %}
    {%- if message['role'] == 'user' %}
        {%- set ns.last_user = loop.index0 %}
    {%- endif %}
{%- endfor %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message['role'] == 'user' %}
        {%- if tools and loop.index0 == ns.last_user %}
            {{- '[AVAILABLE_TOOLS] ' + tools | tojson + '[/AVAILABLE_TOOLS]' }}
        {%- endif %}
        {%- if system_message and loop.index0 == ns.last_user %}
            {{- '[INST] ' + system_message + '\n\n' + message['content'] + '[/INST]' }}
        {%- else %}
            {{- '[INST] ' + message['content'] + '[/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' and message['tool_calls'] %}
        {{- '[TOOL_CALLS] [' }}
        {%- for tool_call in message['tool_calls'] %}
            {%- set call = tool_call['function'] if tool_call['function'] is defined else tool_call %}
            {{- '{"name": "' + call['name'] + '", "arguments": ' + call['arguments'] | tojson }}
            {%- if tool_call['id'] is defined %}
                {{- ', "id": "' + tool_call['id'] + '"' }}
            {%- endif %}
            {{- '}' }}
            {%- if not loop.last %}
                {{- ', ' }}
            {%- endif %}
        {%- endfor %}
        {{- ']' + eos_token }}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token }}
    {%- elif message['role'] == 'tool' %}
        {%- set call_id = message['tool_call_id'] if message['tool_call_id'] is defined else '' %}
        {{- '[TOOL_RESULTS] {"content": ' + message['content'] | tojson + ', "call_id": "' + call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception('after an optional system message, only user, assistant and tool messages are supported') }}
    {%- endif %}
{%- endfor %}
)JINJA";

using nlohmann::ordered_json;

// tokenizer.json's added tokens as tokenizer_config.json's added_tokens_decoder.
ordered_json AddedTokensDecoder(const ordered_json& tokenizer) {
  ordered_json decoder = ordered_json::object();
  for (const ordered_json& token : tokenizer.at("added_tokens")) {
    decoder[std::to_string(token.at("id").get<int64_t>())] = ordered_json{
        {"content", token.at("content").get<std::string>()}, {"lstrip", token.value("lstrip", false)},
        {"normalized", token.value("normalized", false)},   {"rstrip", token.value("rstrip", false)},
        {"single_word", token.value("single_word", false)}, {"special", token.value("special", true)}};
  }
  return decoder;
}

// A fast tokenizer's config: tokenizer.json as written, these special tokens, the template.
std::string FastTokenizerConfigJson(std::string_view tokenizer_json, int64_t model_max_length, const char* bos,
                                    const char* eos, const char* unk, std::string_view chat_template) {
  const ordered_json tokenizer = ordered_json::parse(tokenizer_json);
  ordered_json config{{"added_tokens_decoder", AddedTokensDecoder(tokenizer)},
                      {"bos_token", bos},
                      {"chat_template", std::string(chat_template)},
                      {"clean_up_tokenization_spaces", false},
                      {"eos_token", eos},
                      {"model_max_length", model_max_length},
                      {"tokenizer_class", "PreTrainedTokenizerFast"}};
  if (unk != nullptr) config["unk_token"] = unk;
  return config.dump(2) + "\n";
}

}  // namespace

std::string_view Qwen25ChatTemplate() { return kQwen25ChatTemplate; }

std::string_view Llama3ChatTemplate() { return kLlama3ChatTemplate; }
std::string_view MistralChatTemplate() { return kMistralChatTemplate; }

std::string Llama3TokenizerConfigJson(std::string_view tokenizer_json, int64_t model_max_length) {
  return FastTokenizerConfigJson(tokenizer_json, model_max_length, "<|begin_of_text|>", "<|eot_id|>", nullptr,
                                 kLlama3ChatTemplate);
}

std::string MistralTokenizerConfigJson(std::string_view tokenizer_json, int64_t model_max_length) {
  return FastTokenizerConfigJson(tokenizer_json, model_max_length, "<s>", "</s>", "<unk>", kMistralChatTemplate);
}

std::string Qwen2TokenizerConfigJson(std::string_view tokenizer_json, int64_t model_max_length) {
  const ordered_json tokenizer = ordered_json::parse(tokenizer_json);
  ordered_json additional = ordered_json::array();
  for (const ordered_json& token : tokenizer.at("added_tokens")) {
    const std::string content = token.at("content").get<std::string>();
    // Qwen2.5 lists every special token but the pad token here.
    if (token.value("special", true) && content != "<|endoftext|>") additional.push_back(content);
  }
  ordered_json config{{"add_bos_token", false},
                      {"add_prefix_space", false},
                      {"added_tokens_decoder", AddedTokensDecoder(tokenizer)},
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
