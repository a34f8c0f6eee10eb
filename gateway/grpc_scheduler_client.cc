#include "gateway/grpc_scheduler_client.h"

#include <grpcpp/client_context.h>
#include <grpcpp/support/client_callback.h>

#include "ferry/v1/scheduler.grpc.pb.h"

namespace ferry::gateway {

namespace {

constexpr auto kHealthCheckTimeout = std::chrono::milliseconds(1000);

// One Submit stream, owning its context; deleted once its reader has seen the end. A hold keeps
// OnDone back until the reader stops reading, since reads also start from the reader's side (the
// front's answer to a chunk), outside this reactor's reactions.
class GrpcStream final : public SchedulerStream, public grpc::ClientReadReactor<ferry::v1::TokenEvent> {
 public:
  GrpcStream(ferry::v1::Scheduler::Stub& stub, const ferry::v1::SubmitRequest& submit,
             std::chrono::system_clock::time_point deadline, std::shared_ptr<StreamReader> reader)
      : stub_(stub), submit_(submit), reader_(std::move(reader)) {
    if (deadline != std::chrono::system_clock::time_point::max()) context_.set_deadline(deadline);
  }

  void Start() override {
    stub_.async()->Submit(&context_, &submit_, this);
    AddHold();
    StartRead(&event_);
    StartCall();  // the last touch: reactions may run from here on
  }
  void ReadNext() override {
    event_.Clear();
    StartRead(&event_);
  }
  void StopReading() override { RemoveHold(); }
  void Cancel() override { context_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return StopReading();
    reader_->OnEvent(event_);
  }
  // The reader drops its hold on this stream (its cancel) before it returns.
  void OnDone(const grpc::Status& status) override {
    std::shared_ptr<StreamReader> reader = std::move(reader_);
    reader->OnStreamDone(Status(static_cast<StatusCode>(status.error_code()), status.error_message()));
    delete this;
  }

 private:
  ferry::v1::Scheduler::Stub& stub_;
  const ferry::v1::SubmitRequest& submit_;
  std::shared_ptr<StreamReader> reader_;
  grpc::ClientContext context_;
  ferry::v1::TokenEvent event_;
};

class GrpcSchedulerClient final : public SchedulerClient {
 public:
  GrpcSchedulerClient(std::vector<std::shared_ptr<grpc::Channel>> channels, const std::vector<std::string>& addresses)
      : router_(addresses, [this](size_t i) { return Probe(i); }) {
    for (const auto& channel : channels) stubs_.push_back(ferry::v1::Scheduler::NewStub(channel));
  }

  ReplicaRouter& router() override { return router_; }
  SchedulerStream* NewStream(size_t replica, const ferry::v1::SubmitRequest& submit,
                             std::chrono::system_clock::time_point deadline,
                             std::shared_ptr<StreamReader> reader) override {
    return new GrpcStream(*stubs_[replica], submit, deadline, std::move(reader));
  }

 private:
  // Whether replica i answers GetState within the health check's timeout.
  bool Probe(size_t i) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kHealthCheckTimeout);
    ferry::v1::SchedulerState state;
    return stubs_[i]->GetState(&context, ferry::v1::GetStateRequest(), &state).ok();
  }

  std::vector<std::unique_ptr<ferry::v1::Scheduler::Stub>> stubs_;
  ReplicaRouter router_;  // after stubs_: its health thread probes them until it is destroyed
};

}  // namespace

std::shared_ptr<SchedulerClient> MakeGrpcSchedulerClient(std::vector<std::shared_ptr<grpc::Channel>> channels,
                                                         const std::vector<std::string>& addresses) {
  return std::make_shared<GrpcSchedulerClient>(std::move(channels), addresses);
}

}  // namespace ferry::gateway
