// OpenAI's Responses API (/v1/responses) on the chat path. A request is read into the typed chat
// request chat's endpoint also reads into (chat_request.h): instructions and input items become
// chat messages, `tools` tool specs, `text.format` the structured output constraint, each error
// naming the Responses field that caused it; BuildChatGeneration then checks and renders it as it
// does for chat, so the chat template, tool calls and structured output are the chat endpoint's
// own. The chat result is translated back into a Response object (output items: a message,
// function calls), or into the Responses stream's events. Plain functions on JSON, and the
// stream's format (sse_stream.h): no sockets.
//
// previous_response_id continues a stored response: its history (the chat messages it was
// generated from, and its output as the assistant's turn) comes before the new input; its
// instructions do not carry over (OpenAI's rule).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "ferry/v1/generation.pb.h"
#include "gateway/http/chat_template.h"
#include "gateway/http/openai_format.h"
#include "gateway/http/sse_stream.h"
#include "gateway/http/tool_calls.h"

namespace ferry::gateway::http {

struct ResponsesRequest {
  OpenAiRequest chat;  // what runs: one choice
  std::vector<ChatMessage> history;  // the messages before the generated turn (no instructions), for the store
  json echo;  // the request's settings a Response object repeats (instructions, tools, ...)
  bool store = true;  // kept for GET and previous_response_id
};

// body_text: the text `body` was parsed from (key order for tools and schemas). previous: the
// stored history of body.previous_response_id (the caller looks it up; nullptr when none).
std::variant<ResponsesRequest, ApiError> ParseResponsesRequest(const json& body, std::string_view body_text,
                                                               const ChatTemplate& chat,
                                                               const std::vector<ChatMessage>* previous);

// What one generation said, in the Responses API's terms.
struct ResponsesResult {
  std::string message_id;              // "msg_<hex>": the message item's, when there is text
  std::optional<std::string> text;     // the message's text; nullopt: no message item
  std::vector<ToolCall> calls;         // function_call items, in order (id: the call_id)
  std::vector<std::string> call_item_ids;  // "fc_<hex>", one per call
  ferry::v1::FinishReason finish = ferry::v1::FINISH_REASON_UNSPECIFIED;
  ferry::v1::Usage usage;
};
ResponsesResult ResultFromGeneration(const ferry::v1::GenerateResponse& response, const ToolsRequest& tools);

struct ResponsesIdentity {
  std::string id;  // "resp_<hex>"
  int64_t created = 0;
  std::string model;
};
// The Response object: "in_progress" without a result, "completed", or "incomplete" (cut by
// max_output_tokens). `error`: a failed response's {"code", "message"}.
json ResponseJson(const ResponsesIdentity& identity, const json& echo, const ResponsesResult* result,
                  const json& error = nullptr);
// The chat history after this response: `history` then its output as the assistant's turn.
std::vector<ChatMessage> HistoryAfter(std::vector<ChatMessage> history, const ResponsesResult& result);

std::string NewResponsesId(const char* prefix);  // "<prefix>_<24 hex>"

// The Responses stream's events, in OpenAI's order: response.created, response.in_progress; per
// output item its .added, its content (output_text deltas; function call argument deltas) and
// its .done; then response.completed (or .incomplete, or .failed). Each is "event: <type>\ndata:
// <json>\n\n" with its sequence_number; there is no [DONE]. on_complete gets the final Response
// object and result (to store them) once the generation ended well.
class ResponsesStreamFormat final : public StreamFormat {
 public:
  ResponsesStreamFormat(ResponsesIdentity identity, json echo,
                        std::function<void(const json& response, const ResponsesResult& result)> on_complete);
  std::string Chunk(int32_t index, const ferry::v1::GenerateChunk& chunk, nlohmann::json tool_calls,
                    bool tools_called) override;
  std::string End(const Status& status) override;

 private:
  std::string Event(const std::string& type, json body);
  void OpenMessage(std::string& out);
  void CloseMessage(std::string& out);
  void TakeCalls(const json& tool_calls, std::string& out);

  const ResponsesIdentity identity_;
  const json echo_;
  const std::function<void(const json&, const ResponsesResult&)> on_complete_;
  ResponsesResult result_;
  int64_t sequence_ = 0;
  bool is_started_ = false;
  int32_t num_items_ = 0;             // output items added so far
  int32_t message_index_ = -1;        // the open message item's output_index; -1: none open
  std::vector<int32_t> call_of_index_;      // by chat's delta index: the call's place in result_.calls
  std::vector<int32_t> call_output_index_;  // per call: its output_index
};

}  // namespace ferry::gateway::http
