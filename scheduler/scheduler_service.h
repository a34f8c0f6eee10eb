// gRPC adapter of the scheduler: Submit streams one sequence's tokens from the
// engine loop to the gateway; cancelling the call cancels the sequence. Submit
// is a callback (reactor) method: no thread per stream waits for tokens; the
// engine loop's push starts the write. The admin calls are plain sync methods.
#pragma once

#include "ferry/v1/scheduler.grpc.pb.h"
#include "scheduler/engine_loop.h"

namespace ferry::scheduler {

class SchedulerService final : public ferry::v1::Scheduler::WithCallbackMethod_Submit<ferry::v1::Scheduler::Service> {
 public:
  SchedulerService(EngineLoop& loop, ferry::v1::SchedulerInfo info) : loop_(loop), info_(std::move(info)) {}

  grpc::Status Info(grpc::ServerContext*, const ferry::v1::SchedulerInfoRequest*,
                    ferry::v1::SchedulerInfo* out) override;
  grpc::ServerWriteReactor<ferry::v1::TokenEvent>* Submit(grpc::CallbackServerContext* context,
                                                          const ferry::v1::SubmitRequest* request) override;
  grpc::Status GetState(grpc::ServerContext*, const ferry::v1::GetStateRequest*,
                        ferry::v1::SchedulerState* out) override;
  grpc::Status SetMaxNumSeqs(grpc::ServerContext*, const ferry::v1::SetMaxNumSeqsRequest* request,
                             ferry::v1::SchedulerState* out) override;

 private:
  EngineLoop& loop_;
  const ferry::v1::SchedulerInfo info_;
};

}  // namespace ferry::scheduler
