#include "gateway/generation_service.h"
#include "gateway/request_validation.h"

#include <memory>

#include "gateway/grpc_admission.h"

namespace ferry::gateway {

namespace {

using ferry::v1::GenerateChunk;

grpc::Status ToGrpc(const Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.error_code()), status.error_message());
}

// What both reactors share: the caller's admission, the scheduler call's deadline and
// cancellation (the client's, as gRPC would propagate them), the refund of unused tokens and the
// retry trailer.
class Front {
 public:
  Front(GenerationService& service, grpc::CallbackServerContext* context)
      : service_(service), context_(context) {}

  // Admits the caller and starts its call, kept in `slot` first: the call may end, and the
  // reactor with it, before Start returns. A refusal goes straight to `done`.
  void Start(const ferry::v1::GenerateRequest& request, std::function<void(GenerateChunk)> write,
             std::function<void(Status, int64_t)> done, std::shared_ptr<GenerationCall>& slot) {
    if (std::string e = CheckIdempotencyKey(request.idempotency_key()); !e.empty()) {
      service_.generator().CountRejection("invalid", request.lane(), StatusCode::kInvalidArgument);
      return done(Status(StatusCode::kInvalidArgument, e), 0);
    }
    if (grpc::Status refused = Admit(request); !refused.ok()) {
      return done(Status(static_cast<StatusCode>(refused.error_code()), refused.error_message()), 0);
    }
    CallHooks hooks;
    hooks.deadline = context_->deadline();
    hooks.cancel = &cancel_;
    hooks.client_cancelled = [context = context_] { return context->IsCancelled(); };
    hooks.write = std::move(write);
    hooks.done = std::move(done);
    slot = service_.generator().NewCall(std::move(hooks));
    std::shared_ptr<GenerationCall> call = slot;
    if (request.idempotency_key().empty()) return call->Start(request);
    ferry::v1::GenerateRequest scoped = request;  // the tenant's own key
    scoped.set_idempotency_key(ScopeIdempotencyKey(admission_.tenant, request.idempotency_key()));
    call->Start(scoped);
  }

  // The client cancelled, or its deadline passed: the scheduler frees the sequence.
  void Cancel() { cancel_.Cancel(); }

  void Count(const GenerateChunk& chunk) {
    if (chunk.finish_reason() != ferry::v1::FINISH_REASON_UNSPECIFIED) {
      completion_tokens_ = chunk.usage().completion_tokens();
    }
  }

  // The request ended: gRPC's retry design (the server tells the client when to retry a refused
  // call), and the refund.
  void End(int64_t retry_after_ms) {
    if (retry_after_ms > 0) context_->AddTrailingMetadata("grpc-retry-pushback-ms", std::to_string(retry_after_ms));
    RefundUnused(service_.auth(), admission_, completion_tokens_);
  }

 private:
  // Authenticates and charges the caller; a status to answer at once when refused.
  grpc::Status Admit(const ferry::v1::GenerateRequest& request) {
    admission_ = AdmitCall(service_.auth(), service_.generator(), *context_, request);
    if (!admission_.status.ok()) {
      const bool limited = admission_.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
      service_.generator().CountRejection(limited ? "rate_limit" : "auth", request.lane(),
                                          static_cast<StatusCode>(admission_.status.error_code()));
    }
    return admission_.status;
  }

  GenerationService& service_;
  grpc::CallbackServerContext* context_;
  Admission admission_;
  CancelSource cancel_;  // alive until the call's end
  int32_t completion_tokens_ = 0;
};

class StreamReactor final : public grpc::ServerWriteReactor<GenerateChunk> {
 public:
  StreamReactor(GenerationService& service, grpc::CallbackServerContext* context,
                const ferry::v1::GenerateRequest& request)
      : front_(service, context) {
    front_.Start(
        request,
        [this](GenerateChunk chunk) {
          front_.Count(chunk);
          out_ = std::move(chunk);
          StartWrite(&out_);
        },
        [this](Status status, int64_t retry_after_ms) {
          front_.End(retry_after_ms);
          Finish(ToGrpc(status));
        },
        call_);
  }

  void OnCancel() override { front_.Cancel(); }
  void OnWriteDone(bool ok) override {
    std::shared_ptr<GenerationCall> call = call_;
    call->WriteDone(ok);
  }
  void OnDone() override { delete this; }

 private:
  Front front_;
  GenerateChunk out_;  // the write in flight
  std::shared_ptr<GenerationCall> call_;
};

class UnaryReactor final : public grpc::ServerUnaryReactor {
 public:
  UnaryReactor(GenerationService& service, grpc::CallbackServerContext* context,
               const ferry::v1::GenerateRequest& request, ferry::v1::GenerateResponse* response)
      : front_(service, context), response_(response) {
    front_.Start(
        request,
        [this](GenerateChunk chunk) {
          front_.Count(chunk);
          AppendChunk(chunk, *response_);
          std::shared_ptr<GenerationCall> call = call_;
          call->WriteDone(true);
        },
        [this](Status status, int64_t retry_after_ms) {
          front_.End(retry_after_ms);
          // A unary call that ran out of time must end with DEADLINE_EXCEEDED (gRPC's rule); the
          // partial text is then dropped.
          if (status.ok() && response_->finish_reason() == ferry::v1::FINISH_REASON_TIMEOUT) {
            status = Status(StatusCode::kDeadlineExceeded, "deadline reached while generating");
          }
          Finish(ToGrpc(status));
        },
        call_);
  }

  void OnCancel() override { front_.Cancel(); }
  void OnDone() override { delete this; }

 private:
  Front front_;
  ferry::v1::GenerateResponse* response_;
  std::shared_ptr<GenerationCall> call_;
};

}  // namespace

grpc::ServerUnaryReactor* GenerationService::Generate(grpc::CallbackServerContext* context,
                                                      const ferry::v1::GenerateRequest* request,
                                                      ferry::v1::GenerateResponse* response) {
  return new UnaryReactor(*this, context, *request, response);
}

grpc::ServerWriteReactor<GenerateChunk>* GenerationService::GenerateStream(grpc::CallbackServerContext* context,
                                                                           const ferry::v1::GenerateRequest* request) {
  return new StreamReactor(*this, context, *request);
}

}  // namespace ferry::gateway
