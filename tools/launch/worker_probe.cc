#include "tools/launch/worker_probe.h"

#include <grpcpp/grpcpp.h>

#include "ferry/v1/worker.grpc.pb.h"

namespace ferry::launch {

namespace {

constexpr auto kPeriod = std::chrono::seconds(1);
constexpr auto kDeadline = std::chrono::seconds(1);

std::shared_ptr<grpc::Channel> ProbeChannel(const std::string& address, const TlsFlags& tls) {
  grpc::ChannelArguments args;
  // A channel of its own (not a subchannel shared with an earlier probe of the same address,
  // which may still be backing off from the dead process), reconnecting within a period.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return InternalChannel(address, tls, args);
}

}  // namespace

WorkerProbe::WorkerProbe(std::string address, const TlsFlags& tls)
    : address_(std::move(address)), tls_(tls), last_ok_(std::chrono::steady_clock::now().time_since_epoch().count()) {
  thread_ = std::thread([this] { Run(); });
}

WorkerProbe::~WorkerProbe() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::chrono::steady_clock::duration WorkerProbe::silent_for() const {
  const std::chrono::steady_clock::time_point last{std::chrono::steady_clock::duration(last_ok_.load())};
  return std::chrono::steady_clock::now() - last;
}

void WorkerProbe::Run() {
  auto stub = ferry::v1::Worker::NewStub(ProbeChannel(address_, tls_));
  std::unique_lock lock(mu_);
  while (!stopping_) {
    const auto start = std::chrono::steady_clock::now();
    lock.unlock();
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kDeadline);
    ferry::v1::HealthResponse response;
    const grpc::Status status = stub->Health(&context, ferry::v1::HealthRequest(), &response);
    if (status.ok() && response.ok()) last_ok_ = std::chrono::steady_clock::now().time_since_epoch().count();
    lock.lock();
    wake_.wait_until(lock, start + kPeriod, [this] { return stopping_; });
  }
}

}  // namespace ferry::launch
