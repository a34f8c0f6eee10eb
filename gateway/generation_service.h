// gRPC adapter of the public Generation API: validates, tokenises, submits to
// the scheduler and streams detokenised text back.
#pragma once

#include <functional>

#include <grpcpp/channel.h>
#include <memory>

#include <prometheus/registry.h>

#include "ferry/v1/generation.grpc.pb.h"
#include "ferry/v1/scheduler.grpc.pb.h"
#include "gateway/completion_text.h"
#include "gateway/lanes.h"
#include "gateway/request_validation.h"
#include "gateway/tokenizer/tokenizer.h"

namespace ferry::gateway {

struct GatewayMetrics;

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

struct GatewayOptions {
  ModelLimits limits;
  LaneTable lanes = LaneTable::Defaults();
};

class GenerationService final : public ferry::v1::Generation::Service {
 public:
  GenerationService(const tokenizer::Tokenizer& tokenizer, std::shared_ptr<grpc::Channel> scheduler,
                    GatewayOptions options, prometheus::Registry& registry);
  ~GenerationService() override;

  grpc::Status Generate(grpc::ServerContext* context, const ferry::v1::GenerateRequest* request,
                        ferry::v1::GenerateResponse* response) override;
  grpc::Status GenerateStream(grpc::ServerContext* context, const ferry::v1::GenerateRequest* request,
                              grpc::ServerWriter<ferry::v1::GenerateChunk>* writer) override;

 private:
  using ChunkSink = std::function<bool(const ferry::v1::GenerateChunk&)>;
  // Runs one request to its end, handing each chunk to sink (false = client
  // gone). The last chunk carries finish reason, usage and timings.
  grpc::Status Run(grpc::ServerContext* context, ferry::v1::GenerateRequest request, const ChunkSink& sink);

  // Decides the call's status once the scheduler stream has ended.
  grpc::Status Conclude(grpc::ServerContext* context, const grpc::Status& downstream, bool client_gone,
                        StreamProgress& progress);

  const tokenizer::Tokenizer& tokenizer_;
  std::unique_ptr<ferry::v1::Scheduler::Stub> scheduler_;
  const GatewayOptions options_;
  std::unique_ptr<GatewayMetrics> metrics_;
};

}  // namespace ferry::gateway
