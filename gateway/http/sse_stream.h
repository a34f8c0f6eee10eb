// The server-sent events of one streamed OpenAI request, written to its connection by whichever
// thread has them. A chunk arrives on a gRPC thread (choice_set.h); once the response headers are
// out, that thread formats it and sends it on the socket itself when the socket takes it at once
// (MSG_DONTWAIT), so a token costs no wake of the connection's thread. What the socket does not
// take at once waits, in order, for the connection's thread, which sends it blocking; chunks that
// come meanwhile queue behind it. The events go out as HTTP/1.1 chunks, the framing cpp-httplib's
// chunked content provider uses, and the provider ends the body (sink.done()).
//
// Measured on the 2-core VM (docs/benchmarks/bench.md 2g): the connection thread waking for every
// token was half of the gateway's CPU at 256 streams.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ferry/v1/generation.pb.h"
#include "gateway/http/openai_format.h"

namespace httplib {
class DataSink;
}

namespace ferry::gateway::http {

// `data` as one chunk of a chunked HTTP body: "<hex size>\r\n<data>\r\n".
std::string HttpChunk(std::string_view data);

// What the events of one stream say: chat/completions chunks (ChatStreamFormat), or the
// Responses API's events (responses_format.h). Called under the stream's lock, so one call at a
// time; a choice's chunks in order.
class StreamFormat {
 public:
  virtual ~StreamFormat() = default;
  // The events for choice `index`'s next chunk (empty: none); with tools, its delta.tool_calls
  // (null: none) and whether a call went out (StreamState).
  virtual std::string Chunk(int32_t index, const ferry::v1::GenerateChunk& chunk, nlohmann::json tool_calls,
                            bool tools_called) = 0;
  // The closing events once every choice has ended with `status` (after the first chunk).
  virtual std::string End(const Status& status) = 0;
};

// OpenAI's chat and completions chunks: "data: <chunk>" per chunk; at the end the usage chunk
// (stream_options.include_usage) or the error, then "data: [DONE]".
class ChatStreamFormat final : public StreamFormat {
 public:
  // `num_choices` choices, `n` per prompt (a prompt's usage counts once).
  ChatStreamFormat(ResponseContext ctx, int32_t num_choices, int32_t n, bool include_usage);
  std::string Chunk(int32_t index, const ferry::v1::GenerateChunk& chunk, nlohmann::json tool_calls,
                    bool tools_called) override;
  std::string End(const Status& status) override;

 private:
  const ResponseContext ctx_;
  const int32_t n_;
  const bool include_usage_;
  std::vector<StreamState> states_;  // per choice
  ferry::v1::Usage usage_;           // the prompts once, the completions of every choice
};

class SseStream {
 public:
  explicit SseStream(std::unique_ptr<StreamFormat> format);
  // A chat or completions stream (ChatStreamFormat).
  SseStream(ResponseContext ctx, int32_t num_choices, int32_t n, bool include_usage)
      : SseStream(std::make_unique<ChatStreamFormat>(std::move(ctx), num_choices, n, include_usage)) {}

  // Any thread, in order per choice: one chunk of choice `index`; with tools, its
  // delta.tool_calls (null: none) and whether a call went out (StreamState).
  void OnChunk(int32_t index, const ferry::v1::GenerateChunk& chunk, nlohmann::json tool_calls = nullptr,
               bool tools_called = false);
  // Any thread, once, after every choice's last chunk: how the request ended.
  void End(const Status& status);

  // The connection's thread, before the headers: waits for the first chunk or the end; the
  // error when the request failed before any chunk (it keeps its own HTTP status then).
  std::optional<Status> WaitStarted();
  // The same wait, for at most `timeout`: true when the first chunk or the end came.
  bool WaitStartedFor(std::chrono::milliseconds timeout);
  // The connection's thread, after the headers: writes the rest of the stream to `socket` (the
  // connection's; -1: everything goes through `sink` from this thread) and ends the body. False
  // when the client went away; the caller cancels the generation then.
  bool Serve(int socket, httplib::DataSink& sink);

  // Chunks the gRPC threads sent on the socket themselves (for tests and counters).
  int64_t direct_sends() const;

 private:
  void SendOrQueueLocked(std::string event);
  bool FlushLocked(std::unique_lock<std::mutex>& lock, int socket, httplib::DataSink& sink);

  const std::unique_ptr<StreamFormat> format_;  // under mu_

  mutable std::mutex mu_;
  std::condition_variable cv_;
  int socket_ = -1;                  // set by Serve: from then on chunks may be sent directly
  std::string unsent_tail_;          // the rest of a chunk the socket took only part of (framed)
  std::string queued_;               // events not yet sent (unframed), after unsent_tail_
  bool is_flushing_ = false;         // the connection's thread is sending: nobody else may
  bool is_started_ = false;
  bool is_ended_ = false;
  bool is_broken_ = false;           // a send failed: the client is gone
  Status status_;
  int64_t direct_sends_ = 0;
};

}  // namespace ferry::gateway::http
