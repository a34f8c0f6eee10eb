// ferry-bench over the OpenAI-compatible HTTP API (/v1/completions or /v1/chat/completions with
// stream=true), so the same tool measures Ferry's HTTP front and any other server that speaks it
// (vLLM, SGLang, TGI's OpenAI route). Chunks are timed as vLLM's bench does: every SSE event
// with a non-empty `choices` is a content chunk; the token count comes from the final usage
// event (stream_options.include_usage), or is the number of content chunks when a server sends
// no usage.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "tools/bench/runner.h"
#include "tools/bench/sampling_options.h"

namespace ferry::bench {

struct HttpClientOptions {
  std::string base_url;                   // "http://127.0.0.1:8000"
  std::string endpoint = "/v1/completions";  // or "/v1/chat/completions"
  std::string model;                      // empty: the first model GET /v1/models lists
  std::string api_key;                    // sent as "Authorization: Bearer <key>" when set
  bool ignore_eos = true;                 // vLLM's extra field; Ferry accepts it too
  BenchSampling sampling;
  double connect_timeout_s = 10;
};

bool IsChatEndpoint(const std::string& endpoint);

// Resolves the model name when it is empty (throws std::runtime_error when the server cannot say),
// then returns a factory of clients, one keep-alive connection each.
ClientFactory MakeHttpClientFactory(HttpClientOptions options);

// Splits a server-sent-events byte stream into the data payloads of its events ("data: x\n\n";
// several data lines of one event are joined with "\n"; CRLF tolerated).
class SseParser {
 public:
  void Feed(std::string_view bytes, const std::function<void(const std::string&)>& on_data);

 private:
  std::string buffer_;
};

// What one SSE data payload says, for timing and counting.
struct StreamEvent {
  bool is_done = false;       // "[DONE]"
  bool has_choice = false;    // a content chunk (timed as one)
  std::string finish_reason;  // set on the chunk that ends the choice
  int32_t prompt_tokens = -1;      // from usage, when present
  int32_t completion_tokens = -1;  // from usage, when present
  std::string error;          // an {"error": ...} event's message
};
// Throws std::invalid_argument when the payload is not JSON.
StreamEvent ParseStreamEvent(const std::string& data);

}  // namespace ferry::bench
