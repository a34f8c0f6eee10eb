#include "gateway/grpc_scheduler_client.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>

#include <grpcpp/client_context.h>
#include <spdlog/spdlog.h>

#include "ferry/v1/scheduler.grpc.pb.h"
#include "gateway/deadline_timer.h"
#include "gateway/session_mux.h"

namespace ferry::gateway {

namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr auto kHealthCheckTimeout = std::chrono::milliseconds(1000);
// A load reads the adapter on every worker of the replica: seconds at most, on a slow disk.
constexpr auto kLoraCallTimeout = std::chrono::seconds(120);

Status FromGrpc(const grpc::Status& status) {
  return {static_cast<StatusCode>(status.error_code()), status.error_message()};
}
// How long a client being destroyed waits for its sessions to go (LiveSessions).
constexpr auto kSessionsGoneTimeout = std::chrono::milliseconds(5000);

class GrpcSchedulerClient final : public DynamicSchedulerClient {
 public:
  GrpcSchedulerClient(std::vector<std::vector<std::shared_ptr<grpc::Channel>>> channels,
                      const std::vector<std::string>& addresses, ChannelFactory factory = nullptr)
      : factory_(std::move(factory)), router_({}, [this](size_t i) { return Probe(i); }) {
    for (size_t i = 0; i < channels.size(); ++i) AddLocked(addresses.at(i), std::move(channels[i]));
  }
  ~GrpcSchedulerClient() override {
    for (size_t i = 0; i < router_.size(); ++i) {
      Replica& replica = *replicas_[i];
      std::vector<std::shared_ptr<Session>> sessions;
      {
        std::lock_guard lock(replica.mu);
        sessions = replica.sessions;
      }
      for (const auto& session : sessions) {
        if (session) Shutdown(*session);
      }
    }
    // Ended sessions may still be held by their hand-out thread or an OnDone finishing: their
    // channel shares must go before the stubs' (LiveSessions).
    for (size_t i = 0; i < router_.size(); ++i) {
      std::lock_guard lock(replicas_[i]->mu);
      replicas_[i]->sessions.clear();
    }
    if (const int left = live_sessions_.WaitNone(kSessionsGoneTimeout); left > 0) {
      spdlog::warn("scheduler client: {} session(s) still held by unfinished requests after {} ms; their "
                   "channels may close on a gRPC thread", left, kSessionsGoneTimeout.count());
    }
  }

  ReplicaRouter& router() override { return router_; }

  void SetReplicas(const std::vector<std::string>& addresses) override {
    if (!factory_) throw std::logic_error("SetReplicas on a scheduler client made without a channel factory");
    std::lock_guard lock(membership_mu_);
    for (size_t i = 0; i < router_.size(); ++i) {
      const ReplicaRouter::Replica& r = router_.replica(i);
      if (r.listed && std::find(addresses.begin(), addresses.end(), r.address) == addresses.end()) {
        router_.Remove(r.address);
        spdlog::info("scheduler replica {} removed: no new requests; those on it finish there", r.address);
      }
    }
    for (const std::string& address : addresses) {
      bool known = false;
      for (size_t i = 0; i < router_.size() && !known; ++i) known = router_.replica(i).address == address;
      if (known) {
        router_.Add(address);  // listed again if it was removed
        continue;
      }
      AddLocked(address, factory_(address));
      spdlog::info("scheduler replica {} added", address);
    }
  }
  SchedulerStream* NewStream(size_t replica, const ferry::v1::SubmitRequest& submit,
                             std::chrono::system_clock::time_point deadline,
                             std::shared_ptr<StreamReader> reader) override {
    return NewMuxStream(SessionFor(replica), submit, deadline, std::move(reader), timer_);
  }
  Status LoadLora(size_t replica, const std::string& name, const std::string& path) override {
    ferry::v1::LoadLoraAdapterRequest request;
    request.set_lora_name(name);
    request.set_lora_path(path);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kLoraCallTimeout);
    ferry::v1::LoraAdaptersResponse response;
    return FromGrpc(replicas_[replica]->stubs.front()->LoadLoraAdapter(&context, request, &response));
  }
  Status UnloadLora(size_t replica, const std::string& name) override {
    ferry::v1::UnloadLoraAdapterRequest request;
    request.set_lora_name(name);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kLoraCallTimeout);
    ferry::v1::LoraAdaptersResponse response;
    return FromGrpc(replicas_[replica]->stubs.front()->UnloadLoraAdapter(&context, request, &response));
  }

  void After(std::chrono::milliseconds delay, std::function<void()> fn) override {
    // Keys apart from the streams' ids (which count up from 1): the top bit is set.
    timer_.Add(DeadlineTimer::Key{SteadyClock::now() + delay, (uint64_t{1} << 63) | next_timer_id_++}, std::move(fn));
  }

 private:
  struct Replica {
    std::vector<std::unique_ptr<ferry::v1::Scheduler::Stub>> stubs;  // one per connection
    std::mutex mu;
    std::vector<std::shared_ptr<Session>> sessions;  // one per connection; replaced once ended
    size_t next = 0;                                 // round robin over them
  };

  // A live session to replica i, the connections taking turns; one that ended is replaced.
  std::shared_ptr<Session> SessionFor(size_t i) {
    Replica& replica = *replicas_[i];
    std::lock_guard lock(replica.mu);
    const size_t k = replica.next++ % replica.sessions.size();
    std::shared_ptr<Session>& session = replica.sessions[k];
    if (!session || HasEnded(*session)) session = StartSession(*replica.stubs[k], live_sessions_);
    return session;
  }

  // Whether replica i answers GetState within the health check's timeout.
  bool Probe(size_t i) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kHealthCheckTimeout);
    ferry::v1::SchedulerState state;
    if (!replicas_[i]->stubs.front()->GetState(&context, ferry::v1::GetStateRequest(), &state).ok()) return false;
    router_.SetAdapters(i, {{state.lora_names().begin(), state.lora_names().end()},
                            {state.running_lora_adapters().begin(), state.running_lora_adapters().end()}});
    return true;
  }

  DeadlineTimer timer_;
  std::atomic<uint64_t> next_timer_id_{0};
  // A new replica's slot, at the router's next index (under membership_mu_, or in the constructor).
  void AddLocked(const std::string& address, std::vector<std::shared_ptr<grpc::Channel>> channels) {
    if (channels.empty()) throw std::invalid_argument("scheduler replica " + address + ": no channel");
    const size_t i = router_.size();
    if (i == ReplicaRouter::kMaxReplicas) router_.Add(address);  // throws, naming the limit
    auto replica = std::make_unique<Replica>();
    for (const auto& channel : channels) replica->stubs.push_back(ferry::v1::Scheduler::NewStub(channel));
    replica->sessions.resize(replica->stubs.size());
    replicas_[i] = std::move(replica);
    const size_t added = router_.Add(address, false);  // publishes index i to the routing threads
    if (added != i) throw std::logic_error("scheduler replica " + address + " listed twice");
  }

  const ChannelFactory factory_;
  std::mutex membership_mu_;  // SetReplicas
  LiveSessions live_sessions_;  // before replicas_: the stubs (channels) go before it, after every session
  // Slot i is replica i of the router, written before the router publishes i.
  std::unique_ptr<std::unique_ptr<Replica>[]> replicas_{new std::unique_ptr<Replica>[ReplicaRouter::kMaxReplicas]};
  ReplicaRouter router_;  // after replicas_: its health thread probes them until it is destroyed
};

}  // namespace

std::shared_ptr<SchedulerClient> MakeGrpcSchedulerClient(std::vector<std::vector<std::shared_ptr<grpc::Channel>>> channels,
                                                         const std::vector<std::string>& addresses) {
  return std::make_shared<GrpcSchedulerClient>(std::move(channels), addresses);
}

std::shared_ptr<DynamicSchedulerClient> MakeDynamicSchedulerClient(const std::vector<std::string>& addresses,
                                                                   ChannelFactory factory) {
  std::vector<std::vector<std::shared_ptr<grpc::Channel>>> channels;
  for (const std::string& address : addresses) channels.push_back(factory(address));
  return std::make_shared<GrpcSchedulerClient>(std::move(channels), addresses, std::move(factory));
}

std::shared_ptr<SchedulerClient> MakeGrpcSchedulerClient(std::vector<std::shared_ptr<grpc::Channel>> channels,
                                                         const std::vector<std::string>& addresses) {
  std::vector<std::vector<std::shared_ptr<grpc::Channel>>> one_each;
  for (auto& channel : channels) one_each.push_back({std::move(channel)});
  return MakeGrpcSchedulerClient(std::move(one_each), addresses);
}

}  // namespace ferry::gateway
