// The gateway's logic, shared by every front (gRPC, OpenAI HTTP, jobs): validate and tokenise
// a request, submit it to the scheduler, and turn the scheduler's token stream into text chunks
// (incremental detokenisation, stop strings, logprobs, usage, timings). A front prepares the
// scheduler call's ClientContext (deadline, cancellation) and receives chunks either through
// callbacks (Start: no thread per request; generation_call.h) or a blocking sink (Run).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <prometheus/registry.h>

#include "ferry/v1/generation.pb.h"
#include "ferry/v1/scheduler.grpc.pb.h"
#include "gateway/completion_text.h"
#include "gateway/lanes.h"
#include "gateway/replica_router.h"
#include "gateway/request_validation.h"
#include "gateway/tokenizer/tokenizer.h"

namespace ferry::gateway {

struct GatewayMetrics;
class GenerationCall;
struct CallHooks;

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
  bool started = false;  // the scheduler has scheduled the sequence
  double queue_s = 0;
  int32_t num_cached_tokens = 0;  // prompt tokens the scheduler found in its prefix cache
  double first_token_s = 0;
  double last_token_s = 0;  // since arrival, of the latest event that carried tokens
  // prompt_logprobs: the first prompt token, sent (without a logprob) ahead of the others in
  // the first chunk; -1 when not requested or already sent.
  int32_t first_prompt_token = -1;
  // Folds one scheduler event into a chunk; sets reason when it ends the request.
  ferry::v1::GenerateChunk Consume(const ferry::v1::TokenEvent& event, const tokenizer::Tokenizer& tokenizer);
};

// A request that passed validation and holds a place in its lane.
struct AdmittedRequest {
  ValidatedRequest v;
  LaneQueues::Ticket ticket;  // released when the scheduler starts it (or it ends)
  std::chrono::steady_clock::time_point arrival;
};

class Generator {
 public:
  // Returns false when the client is gone; the generation is then cancelled.
  using ChunkSink = std::function<bool(const ferry::v1::GenerateChunk&)>;

  // Hands out the scheduler call's context for each attempt (owned by the caller), or nullptr
  // when no further attempt may be made.
  using ContextFactory = std::function<grpc::ClientContext*()>;

  // One scheduler replica, or several (requests are routed, see replica_router.h).
  Generator(const tokenizer::Tokenizer& tokenizer, std::shared_ptr<ReplicaRouter> router, GatewayOptions options,
            prometheus::Registry& registry);
  Generator(const tokenizer::Tokenizer& tokenizer, std::shared_ptr<grpc::Channel> scheduler, GatewayOptions options,
            prometheus::Registry& registry);
  ~Generator();

  // A request driven by callbacks (generation_call.h): the front keeps the call, then calls its
  // Start, which returns at once; the hooks see its chunks and its end.
  std::shared_ptr<GenerationCall> NewCall(CallHooks hooks);

  // Runs one request to its end on the caller's thread. `downstream` is the scheduler call's context (its deadline
  // and cancellation are the front's business); `client_cancelled` tells whether the client
  // gave up. The last chunk carries finish reason, usage and timings.
  // retry_after_ms (optional): set with a retry hint when the lane is full (RESOURCE_EXHAUSTED).
  // With a factory, a request whose replica fails before it started is retried on another.
  grpc::Status Run(ferry::v1::GenerateRequest request, const ContextFactory& make_context,
                   const std::function<bool()>& client_cancelled, const ChunkSink& sink,
                   int64_t* retry_after_ms = nullptr);
  grpc::Status Run(ferry::v1::GenerateRequest request, grpc::ClientContext& downstream,
                   const std::function<bool()>& client_cancelled, const ChunkSink& sink,
                   int64_t* retry_after_ms = nullptr);

  const tokenizer::Tokenizer& tokenizer() const { return tokenizer_; }
  // A front refused a call before it reached the Generator (reason: "auth", "rate_limit").
  void CountRejection(const std::string& reason, const std::string& lane, grpc::StatusCode code);
  const GatewayOptions& options() const { return options_; }
  // The lane a request's `lane` field names, as Run resolves it (empty: the default lane);
  // nullopt for an unknown name (Run then answers INVALID_ARGUMENT).
  std::optional<std::string> ResolveLane(std::string_view name) const {
    auto lane = options_.lanes.Find(name);
    return lane ? std::optional<std::string>(lane->name) : std::nullopt;
  }

 private:
  friend class GenerationCall;

  // Validates, tokenises and enters the request's lane; a status when it is refused (counted),
  // with a retry hint in retry_after_ms when the lane is full.
  std::variant<grpc::Status, AdmittedRequest> Admit(ferry::v1::GenerateRequest& request, int64_t& retry_after_ms);
  // Decides the call's status once the scheduler stream has ended.
  static grpc::Status Conclude(bool client_cancelled, const grpc::Status& downstream, bool client_gone,
                               StreamProgress& progress);
  static void ApplyLaneDeadline(const Lane& lane, grpc::ClientContext& downstream);

  const tokenizer::Tokenizer& tokenizer_;

  std::shared_ptr<ReplicaRouter> router_;
  const GatewayOptions options_;
  std::unique_ptr<GatewayMetrics> metrics_;
  LaneQueues queues_;
};

// Folds one chunk into a unary response (text, ids and logprobs appended; the last chunk's
// finish reason, usage and timings copied).
void AppendChunk(const ferry::v1::GenerateChunk& chunk, ferry::v1::GenerateResponse& response);

}  // namespace ferry::gateway
