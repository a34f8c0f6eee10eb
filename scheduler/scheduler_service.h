// gRPC adapter of the scheduler: a Session carries many requests of one gateway connection, each
// step's events for all of them in one message; cancelling a request (or ending the session)
// cancels its sequence. Session is a callback (reactor) method: no thread waits per request or
// per session; the engine loop's flush starts the write. The admin calls are plain sync methods.
#pragma once

#include <memory>

#include "ferry/v1/scheduler.grpc.pb.h"
#include "scheduler/answer_records.h"
#include "scheduler/engine_loop.h"

namespace prometheus {
class Counter;
}  // namespace prometheus

namespace ferry::scheduler {

// Requests answered from a record instead of running (SubmitRequest.idempotency_key).
struct Replays {
  // --idempotency-max-bytes, --idempotency-retention-s.
  std::shared_ptr<AnswerRecords> records = std::make_shared<AnswerRecords>(size_t{64} << 20, std::chrono::hours(1));
  prometheus::Counter* replayed = nullptr;  // ferry_scheduler_requests_replayed_total when set
};

class SchedulerService final : public ferry::v1::Scheduler::WithCallbackMethod_Session<ferry::v1::Scheduler::Service> {
 public:
  SchedulerService(EngineLoop& loop, ferry::v1::SchedulerInfo info, Replays replays = {});

  // SIGTERM: every open session refuses new requests (UNAVAILABLE, so that the gateway tries
  // another replica) and ends once the requests on it have ended.
  void Drain();

  grpc::Status Info(grpc::ServerContext*, const ferry::v1::SchedulerInfoRequest*,
                    ferry::v1::SchedulerInfo* out) override;
  grpc::ServerBidiReactor<ferry::v1::SessionRequests, ferry::v1::SessionEvents>* Session(
      grpc::CallbackServerContext* context) override;
  grpc::Status GetState(grpc::ServerContext*, const ferry::v1::GetStateRequest*,
                        ferry::v1::SchedulerState* out) override;
  grpc::Status SetMaxNumSeqs(grpc::ServerContext*, const ferry::v1::SetMaxNumSeqsRequest* request,
                             ferry::v1::SchedulerState* out) override;
  grpc::Status LoadLoraAdapter(grpc::ServerContext*, const ferry::v1::LoadLoraAdapterRequest* request,
                               ferry::v1::LoraAdaptersResponse* out) override;
  grpc::Status UnloadLoraAdapter(grpc::ServerContext*, const ferry::v1::UnloadLoraAdapterRequest* request,
                                 ferry::v1::LoraAdaptersResponse* out) override;

 private:
  struct Sessions;

  EngineLoop& loop_;
  const ferry::v1::SchedulerInfo info_;  // lora_names aside: the loop's (EngineLoop::LoraNames)
  const std::shared_ptr<Sessions> sessions_;
  const Replays replays_;
};

}  // namespace ferry::scheduler
