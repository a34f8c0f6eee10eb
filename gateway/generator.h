// The gateway's logic as the fronts (gRPC, OpenAI HTTP, jobs) see it: it holds what every
// request shares (tokenizer, limits and lanes, lane queues, metrics, the scheduler client) and
// runs each request as a GenerationCall (generation_call.h), driven by callbacks (NewCall) or
// blocking its caller (Run). No gRPC here: the fronts and the scheduler client are the adapters.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <prometheus/registry.h>

#include "ferry/v1/generation.pb.h"
#include "gateway/generation_call.h"
#include "gateway/scheduler_client.h"
#include "gateway/status.h"
#include "gateway/tokenizer/tokenizer.h"

namespace ferry::gateway {

class Generator {
 public:
  // Returns false when the client is gone; the generation is then cancelled.
  using ChunkSink = std::function<bool(const ferry::v1::GenerateChunk&)>;

  // One scheduler replica, or several (requests are routed, see replica_router.h).
  Generator(const tokenizer::Tokenizer& tokenizer, std::shared_ptr<SchedulerClient> scheduler, GatewayOptions options,
            prometheus::Registry& registry);
  ~Generator();

  // A request driven by callbacks (generation_call.h): the front keeps the call, then calls its
  // Start, which returns at once; the hooks see its chunks and its end.
  std::shared_ptr<GenerationCall> NewCall(CallHooks hooks);

  // Runs one request to its end, `sink` taking its chunks on the caller's thread; the last
  // carries finish reason, usage and timings. `hooks` give the deadline, attempts and
  // cancellation (their write and done are Run's). retry_after_ms (optional): set with a retry
  // hint when the lane is full (RESOURCE_EXHAUSTED).
  Status Run(ferry::v1::GenerateRequest request, CallHooks hooks, const ChunkSink& sink,
             int64_t* retry_after_ms = nullptr);

  const tokenizer::Tokenizer& tokenizer() const { return tokenizer_; }
  // A front refused a call before it reached the Generator (reason: "auth", "rate_limit").
  void CountRejection(const std::string& reason, const std::string& lane, StatusCode code);
  // Limits and lanes (options().lanes.Find resolves a request's `lane` as its call will).
  const GatewayOptions& options() const { return options_; }

 private:
  const tokenizer::Tokenizer& tokenizer_;
  const GatewayOptions options_;
  std::shared_ptr<SchedulerClient> scheduler_;
  std::unique_ptr<GatewayMetrics> metrics_;
  LaneQueues queues_;
  GenerationContext context_;  // the above, for the calls
};

// Folds one chunk into a unary response (text, ids and logprobs appended; the last chunk's
// finish reason, usage and timings copied).
void AppendChunk(const ferry::v1::GenerateChunk& chunk, ferry::v1::GenerateResponse& response);

}  // namespace ferry::gateway
