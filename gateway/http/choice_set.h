// The generations behind one OpenAI HTTP request: its choices (OpenAI's `n` per prompt, times
// the prompts of a batch; openai_format.h ExpandChoices), each its own Generator call
// (generation_call.h) running on gRPC's threads. Their chunks, tagged with the choice index, go
// to a sink on the gRPC thread that received them (a stream's: sse_stream.h; a whole response's:
// its choices' texts), so the connection's thread wakes only at the start and the end; the
// request ends when every choice has. One choice that fails cancels the others, and its status is the
// request's. With several choices, choice k runs as request id `<id>-<k>`. With prefix caching
// the scheduler computes a prompt shared by choices once.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "ferry/v1/generation.pb.h"
#include "gateway/generator.h"

namespace ferry::gateway::http {

class ChoiceSet : public std::enable_shared_from_this<ChoiceSet> {
 public:
  // Takes choice `index`'s next chunk on the gRPC thread that received it. A choice's chunks
  // come one after another; calls for different choices may run at once.
  using ChunkSink = std::function<void(int32_t index, const ferry::v1::GenerateChunk& chunk)>;

  ChoiceSet(int32_t num_choices, std::optional<int64_t> timeout_ms);

  // Starts choice k with requests[k] (num_choices of them); their chunks go to `sink` until the
  // client is gone. `on_end` runs once, when the last choice has ended, with the completion
  // tokens of all of them; then WaitEnded returns.
  void Start(Generator& generator, std::vector<ferry::v1::GenerateRequest> requests,
             std::function<void(int64_t completion_tokens)> on_end, ChunkSink sink);
  // Waits until every choice has ended, and every chunk was given to the sink.
  void WaitEnded();
  // OK, or the first choice's failure.
  Status status();
  // Cancels every choice (the client went away).
  void ClientGone();
  bool is_client_gone() const { return is_client_gone_; }
  int32_t size() const { return static_cast<int32_t>(choices_.size()); }

 private:
  struct Choice {
    CancelSource cancel;
    GenerationCall* call = nullptr;  // its hooks run only while it is alive
  };
  void OnChoiceDone(int32_t index, const Status& status);

  std::chrono::system_clock::time_point deadline_ = std::chrono::system_clock::time_point::max();
  std::vector<std::unique_ptr<Choice>> choices_;
  std::function<void(int64_t)> on_end_;
  ChunkSink sink_;
  std::atomic<int64_t> completion_tokens_{0};
  std::atomic<bool> is_client_gone_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  int32_t num_open_ = 0;
  bool is_ended_ = false;
  std::optional<Status> error_;  // the first failure
};

}  // namespace ferry::gateway::http
