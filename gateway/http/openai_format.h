// OpenAI-compatible JSON <-> Ferry's public request and chunk types, for /v1/completions and
// /v1/chat/completions. Plain functions on JSON and protobuf values: no sockets, testable alone.
//
// Semantics follow vLLM's OpenAI server where OpenAI leaves room:
// - finish_reason: "stop" for a stop string, stop token or end-of-sequence; "length" for
//   max_tokens or max_model_len; a request deadline (timeout_ms) that ends a *streamed* request
//   early also gives "length" (generation was cut by a limit); a non-streamed request that runs
//   out of time is answered 504 instead, as gRPC's unary call ends DEADLINE_EXCEEDED.
// - vendor extras accepted as vLLM does: top_k (-1 or 0: off), min_p, repetition_penalty,
//   ignore_eos, stop_token_ids, add_special_tokens (the tokenizer's post-processor tokens, e.g.
//   Llama 3's BOS: completions default true, chat false, as vLLM); plus Ferry's lane and timeout_ms.
// - seed: 0 or absent picks a random seed (Ferry's rule); any other value is reproducible.
// - chat without max_tokens may use the rest of the context (max_model_len - prompt), as vLLM.
// - n > 1: n choices of the same prompt, choice i seeded with seed + i when a seed is set
//   (choice_set.h); usage counts the prompt once and the completions of every choice.
// - /v1/completions takes a list of prompts (a batch), each with its n choices, as vLLM does.
// - logit_bias: {"<token id>": bias in [-100, 100]}, at most 300 entries (OpenAI's limits).
// - min_tokens (vLLM's extra): EOS, stop tokens and stop strings end nothing before it.
// - structured output (sampling.guided), one constraint per request: response_format
//   {"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema": ...}} (both
//   endpoints), vLLM's guided_choice (a list of strings), guided_json (a schema, or a string
//   of one), guided_regex (a pattern the whole text matches) and guided_grammar (EBNF / GBNF:
//   structured/ebnf_grammar.h), or vLLM's structured_outputs {"choice": [...]},
//   {"json_object": true}, {"json": ...}, {"regex": "..."} or {"grammar": "..."}; a second one is
//   a 400 naming it. A schema (structured/json_schema.h) or a regex (structured/regex_dfa.h) is compiled
//   here and one the engine cannot keep is a 400 naming the field and the keyword or construct.
// - chat tools (tool_calls.h): tools, tool_choice ("none", "auto", "required", a named function)
//   and parallel_tool_calls; /v1/completions refuses them.
// - fields that would change the output and are not implemented (the deprecated functions and
//   function_call, best_of != n, structured_outputs' other keys) are refused with 400 naming the
//   field, never ignored.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "ferry/v1/generation.pb.h"
#include "gateway/http/chat_template.h"
#include "gateway/http/tool_calls.h"
#include "gateway/status.h"

namespace ferry::gateway::http {

using nlohmann::json;

// An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
  int64_t retry_after_s = 0;  // 429: sent as Retry-After
};

json ErrorJson(const ApiError& error);
ApiError InvalidField(const std::string& param, const std::string& message);
// "<param> must be <want>, got <type> (<value>)".
std::optional<ApiError> WrongType(const std::string& param, const json& v, const std::string& want);
// Whether body[key] asks for something: values that ask for nothing (null, empty) pass unread.
bool Asks(const json& body, const char* key);

// Reads body[key] into out when present and not null (absent and null ask for nothing); the
// type must match, and an integer fit its type: the error names `key`.
std::optional<ApiError> GetNumber(const json& body, const char* key, std::optional<double>& out);
std::optional<ApiError> GetInt(const json& body, const char* key, std::optional<int64_t>& out);
std::optional<ApiError> GetInt32(const json& body, const char* key, std::optional<int32_t>& out);
std::optional<ApiError> GetBool(const json& body, const char* key, std::optional<bool>& out);
std::optional<ApiError> GetString(const json& body, const char* key, std::optional<std::string>& out);

// Request bodies may nest arrays and objects this deep. None of the API's fields needs more than
// 3; the limit keeps anything recursive (printing, comparing) from running out of stack.
inline constexpr int kMaxJsonDepth = 64;
// True when `text` nests arrays and objects deeper than max_depth (brackets inside strings do
// not count). Checked before parsing.
bool NestsDeeperThan(std::string_view text, int max_depth);
// A short rendering of a client's value for an error message: strings and containers are cut
// (a message never quotes a whole megabyte prompt back).
std::string Brief(const json& value);
// An API's name for a chat parameter a later check refused (the Generator names a field of
// ferry.v1.GenerateRequest, ParamFromMessage its chat name): "" when the API has none.
using ParamName = std::string (*)(const std::string& chat_param);
// Maps the Generator's (or the authenticator's) status to an HTTP error; `param_name` renames the
// param for an API whose fields differ from chat's (nullptr: chat's and completions' names).
ApiError ErrorFromStatus(const Status& status, ParamName param_name = nullptr);

enum class Endpoint { kCompletions, kChat };

// OpenAI's own limit on `n`.
inline constexpr int64_t kMaxChoices = 128;
// Prompts one /v1/completions request may batch.
inline constexpr int64_t kMaxPrompts = 1024;

struct OpenAiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  int32_t n = 1;                        // choices
  ferry::v1::GenerateRequest generate;  // sampling, lane, ... and the first prompt
  // Every prompt (text or token_ids only): several for a /v1/completions batch, else one.
  std::vector<ferry::v1::GenerateRequest> prompts;
  std::string model;
  bool stream = false;
  bool include_usage = false;           // stream_options.include_usage
  std::optional<int64_t> timeout_ms;    // body field timeout_ms
  bool is_max_tokens_set = true;        // chat: false when the client left it to the context
  // Completions' echo: each choice's text (and, with logprobs, its logprobs) starts with its
  // prompt's. Filled at parse time (token-id prompts: empty until decoded by the server).
  bool echo = false;
  std::vector<std::string> echo_texts;  // one per prompt
  // vLLM's prompt_logprobs field: the response carries them in vLLM's form (ResponseContext).
  bool return_prompt_logprobs = false;
  ToolsRequest tools;  // chat: tools, tool_choice, parallel_tool_calls
  // vLLM's truncate_prompt_tokens: each prompt is cut to its last k tokens once tokenised; -1 is
  // max_model_len.
  std::optional<int64_t> truncate_prompt_tokens;
  ParamName param_name = nullptr;  // the request's API's names for a later refusal (ErrorFromStatus)
};

// body_text: the text `body` was parsed from. A JSON schema given as an object is read from it
// again, as ordered_json, so that its keys keep their order (json sorts an object's keys, and
// properties are generated in the schema's order); empty: the schema's keys are sent sorted.
std::variant<OpenAiRequest, ApiError> ParseCompletionRequest(const json& body, std::string_view body_text = {});
// The chat prompt is rendered to text with `chat` (with the request's tools, tool_calls.h); messages must be
// system, user, assistant (with tool_calls or not) or tool.
std::variant<OpenAiRequest, ApiError> ParseChatRequest(const json& body, const ChatTemplate& chat,
                                                       std::string_view body_text = {});
// body.messages rendered with `chat`, ending with the assistant's turn opened (the prompt a chat
// request generates from).
// tools: as ToolsRequest::tools (none: no tools section).
std::variant<std::string, ApiError> RenderChatPrompt(const json& body, std::string_view body_text,
                                                     const ChatTemplate& chat,
                                                     const std::vector<nlohmann::ordered_json>& tools = {});

// One request per choice, in OpenAI's order: prompt p's choice i at index p * n + i, seeded with
// seed + i when a seed is set (so a single request with seed + i reproduces it).
std::vector<ferry::v1::GenerateRequest> ExpandChoices(const OpenAiRequest& r);

// echo: prefixes every choice (prompt p's choice i at index p * n + i) with its prompt's text
// and, when the prompt's logprobs came back, its logprobs with them (the first prompt token's
// without a logprob: null in the JSON, as OpenAI's).
void ApplyEcho(const std::vector<std::string>& prompt_texts, int32_t n,
               std::vector<ferry::v1::GenerateResponse>& responses);

// echo for a stream: each choice's first chunk that has text, tokens or its finish goes out
// prefixed with the prompt's text and, with logprobs, the prompt's logprobs, which the chunks
// before it carried (they are held until then). Each choice's chunks come in order, and a
// choice's state is its own, so choices may call from different threads.
class StreamEcho {
 public:
  StreamEcho(std::vector<std::string> prompt_texts, int32_t n, int32_t num_choices);
  // The chunk to send for choice `index`, or nullopt to send nothing yet.
  std::optional<ferry::v1::GenerateChunk> Apply(int32_t index, const ferry::v1::GenerateChunk& chunk);

 private:
  struct Choice {
    bool is_sent = false;  // the prompt went out
    google::protobuf::RepeatedPtrField<ferry::v1::TokenLogprob> held;  // prompt logprobs so far
  };
  std::vector<std::string> prompt_texts_;
  int32_t n_;
  std::vector<Choice> choices_;
};

// Identity of one response: the same in every chunk of a stream.
struct ResponseContext {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;  // cmpl-... or chatcmpl-...
  int64_t created = 0;
  std::string model;
  // vLLM's prompt_logprobs in the response: per choice (completions) or once (chat).
  bool prompt_logprobs = false;
};

// Whole (non-streamed) response from the accumulated chunks of each choice (index = position);
// `n` choices per prompt, whose prompt usage counts once. tools: a chat request's, whose
// choices' texts become tool calls (tool_calls.h).
json CompletionResponseJson(const ResponseContext& ctx, const std::vector<ferry::v1::GenerateResponse>& choices,
                            int32_t n = 1, const ToolsRequest* tools = nullptr);
inline json CompletionResponseJson(const ResponseContext& ctx, const ferry::v1::GenerateResponse& response) {
  return CompletionResponseJson(ctx, std::vector<ferry::v1::GenerateResponse>{response});
}

// Per-stream state for SSE chunks (chat sends the role once; completions logprobs carry
// text offsets across chunks).
struct StreamState {
  int32_t index = 0;  // the choice
  bool is_role_sent = false;
  int64_t text_offset = 0;
  // Chat with tools (StreamToolCalls): this chunk's delta.tool_calls (null: none), and whether a
  // call went out under tool_choice "auto" (the finish_reason is then "tool_calls").
  json tool_calls;
  bool tools_called = false;
};
// One streamed chunk object (without the "data: " framing). For the last chunk,
// finish_reason is set.
json StreamChunkJson(const ResponseContext& ctx, const ferry::v1::GenerateChunk& chunk, StreamState& state);
// SseEvent(StreamChunkJson(...)), byte for byte; a chunk without logprobs (nearly every one) is
// written directly, without building a JSON tree (2.5 us a chunk on the dev VM).
std::string StreamChunkEvent(const ResponseContext& ctx, const ferry::v1::GenerateChunk& chunk, StreamState& state);
// The extra final chunk for stream_options.include_usage: empty choices and usage.
json StreamUsageJson(const ResponseContext& ctx, const ferry::v1::Usage& usage);
// Adds one choice's usage to a request's total: its completion always, its prompt only for the
// first of its prompt's `n` choices (index % n == 0), so each prompt counts once.
void AddChoiceUsage(const ferry::v1::Usage& choice, size_t index, int32_t n, ferry::v1::Usage& total);
// "data: <json>\n\n"
std::string SseEvent(const json& data);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

std::string FinishReasonName(ferry::v1::FinishReason reason);

}  // namespace ferry::gateway::http
