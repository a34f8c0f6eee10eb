#include "gateway/generation_service.h"

namespace ferry::gateway {

grpc::Status GenerationService::Generate(grpc::ServerContext* context, const ferry::v1::GenerateRequest* request,
                                         ferry::v1::GenerateResponse* response) {
  grpc::Status status = Run(context, *request, [&](const ferry::v1::GenerateChunk& chunk) {
    response->set_request_id(chunk.request_id());
    response->mutable_text()->append(chunk.text());
    response->mutable_token_ids()->Add(chunk.token_ids().begin(), chunk.token_ids().end());
    response->mutable_logprobs()->MergeFrom(chunk.logprobs());
    if (chunk.finish_reason() != ferry::v1::FINISH_REASON_UNSPECIFIED) {
      response->set_finish_reason(chunk.finish_reason());
      *response->mutable_usage() = chunk.usage();
      *response->mutable_timings() = chunk.timings();
    }
    return true;
  });
  // A unary call that ran out of time must end with DEADLINE_EXCEEDED (gRPC's
  // rule); the partial text is then dropped.
  if (status.ok() && response->finish_reason() == ferry::v1::FINISH_REASON_TIMEOUT) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline reached while generating");
  }
  return status;
}

grpc::Status GenerationService::GenerateStream(grpc::ServerContext* context, const ferry::v1::GenerateRequest* request,
                                               grpc::ServerWriter<ferry::v1::GenerateChunk>* writer) {
  return Run(context, *request, [&](const ferry::v1::GenerateChunk& chunk) { return writer->Write(chunk); });
}

grpc::Status GenerationService::Run(grpc::ServerContext* context, const ferry::v1::GenerateRequest& request,
                                    const Generator::ChunkSink& sink) {
  // Propagates the client's deadline and cancellation to the scheduler call.
  auto downstream = grpc::ClientContext::FromServerContext(*context);
  return generator_.Run(request, *downstream, [context] { return context->IsCancelled(); }, sink);
}

}  // namespace ferry::gateway
