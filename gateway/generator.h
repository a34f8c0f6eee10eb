// The gateway's logic, shared by every front (gRPC, OpenAI HTTP, jobs): validate and tokenise
// a request, submit it to the scheduler, and turn the scheduler's token stream into text chunks
// (incremental detokenisation, stop strings, logprobs, usage, timings). A front prepares the
// scheduler call's ClientContext (deadline, cancellation) and receives chunks through a sink.
#pragma once

#include <functional>
#include <memory>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <prometheus/registry.h>

#include "ferry/v1/generation.pb.h"
#include "ferry/v1/scheduler.grpc.pb.h"
#include "gateway/completion_text.h"
#include "gateway/lanes.h"
#include "gateway/request_validation.h"
#include "gateway/tokenizer/tokenizer.h"

namespace ferry::gateway {

struct GatewayMetrics;

struct GatewayOptions {
  ModelLimits limits;
  LaneTable lanes = LaneTable::Defaults();
};

// What one request has produced so far.
struct StreamProgress {
  CompletionText text;
  ferry::v1::GenerateChunk final_chunk;  // sent last, with finish reason, usage and timings
  ferry::v1::FinishReason reason = ferry::v1::FINISH_REASON_UNSPECIFIED;
  int completion_tokens = 0;
  double queue_s = 0;
  double first_token_s = 0;
  // Folds one scheduler event into a chunk; sets reason when it ends the request.
  ferry::v1::GenerateChunk Consume(const ferry::v1::TokenEvent& event, const tokenizer::Tokenizer& tokenizer);
};

class Generator {
 public:
  // Returns false when the client is gone; the generation is then cancelled.
  using ChunkSink = std::function<bool(const ferry::v1::GenerateChunk&)>;

  Generator(const tokenizer::Tokenizer& tokenizer, std::shared_ptr<grpc::Channel> scheduler, GatewayOptions options,
            prometheus::Registry& registry);
  ~Generator();

  // Runs one request to its end. `downstream` is the scheduler call's context (its deadline
  // and cancellation are the front's business); `client_cancelled` tells whether the client
  // gave up. The last chunk carries finish reason, usage and timings.
  grpc::Status Run(ferry::v1::GenerateRequest request, grpc::ClientContext& downstream,
                   const std::function<bool()>& client_cancelled, const ChunkSink& sink);

  const tokenizer::Tokenizer& tokenizer() const { return tokenizer_; }
  const GatewayOptions& options() const { return options_; }

 private:
  // Decides the call's status once the scheduler stream has ended.
  grpc::Status Conclude(bool client_cancelled, const grpc::Status& downstream, bool client_gone,
                        StreamProgress& progress);

  const tokenizer::Tokenizer& tokenizer_;
  std::unique_ptr<ferry::v1::Scheduler::Stub> scheduler_;
  const GatewayOptions options_;
  std::unique_ptr<GatewayMetrics> metrics_;
};

}  // namespace ferry::gateway
