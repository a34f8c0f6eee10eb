#include "gateway/generation_service.h"

#include "gateway/auth/grpc_admission.h"

namespace ferry::gateway {

grpc::Status GenerationService::Generate(grpc::ServerContext* context, const ferry::v1::GenerateRequest* request,
                                         ferry::v1::GenerateResponse* response) {
  grpc::Status status = Run(context, *request, [&](const ferry::v1::GenerateChunk& chunk) {
    AppendChunk(chunk, *response);
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
  const Admission admission = AdmitCall(auth_, generator_, *context, request);
  if (!admission.status.ok()) {
    const bool limited = admission.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
    generator_.CountRejection(limited ? "rate_limit" : "auth", request.lane(), admission.status.error_code());
    return admission.status;
  }
  // Counts what was generated, for the refund.
  ferry::v1::GenerateResponse generated;
  auto counting_sink = [&](const ferry::v1::GenerateChunk& chunk) {
    if (chunk.finish_reason() != ferry::v1::FINISH_REASON_UNSPECIFIED) *generated.mutable_usage() = chunk.usage();
    return sink(chunk);
  };
  // Propagates the client's deadline and cancellation to the scheduler call.
  // Each attempt (a replica that fails before the start is left for another) gets a fresh context.
  std::vector<std::unique_ptr<grpc::ClientContext>> attempts;
  auto make_context = [&]() -> grpc::ClientContext* {
    if (attempts.size() >= 4) return nullptr;
    attempts.push_back(grpc::ClientContext::FromServerContext(*context));
    return attempts.back().get();
  };
  int64_t retry_after_ms = 0;
  grpc::Status status = generator_.Run(request, make_context, [context] { return context->IsCancelled(); },
                                       counting_sink, &retry_after_ms);
  // gRPC's retry design: the server tells the client when to retry a refused call.
  if (retry_after_ms > 0) context->AddTrailingMetadata("grpc-retry-pushback-ms", std::to_string(retry_after_ms));
  RefundUnused(auth_, admission, generated);
  return status;
}

}  // namespace ferry::gateway
