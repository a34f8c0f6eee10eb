// The gateway's gRPC client of its scheduler replicas: scheduler_client.h over ferry.v1.Scheduler
// stubs. Requests travel multiplexed on long-lived Session streams, one per connection to a
// replica: each scheduler step reaches the gateway as one message for all of a session's requests,
// not one message per request (docs/benchmarks/bench.md 2k); the sessions are session_mux.h's. The
// router's health checks ask each replica's GetState.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/channel.h>

#include "gateway/scheduler_client.h"

namespace ferry::gateway {

// channels[i] are the connections to replica i, at addresses[i] (for logs): one session each,
// taking new requests in turn, so that several threads read the replica's steps.
std::shared_ptr<SchedulerClient> MakeGrpcSchedulerClient(std::vector<std::vector<std::shared_ptr<grpc::Channel>>> channels,
                                                         const std::vector<std::string>& addresses);
// One connection per replica: channels[i] reaches replica i.
std::shared_ptr<SchedulerClient> MakeGrpcSchedulerClient(std::vector<std::shared_ptr<grpc::Channel>> channels,
                                                         const std::vector<std::string>& addresses);

// The connections to the replica at an address (replica discovery adds replicas while serving).
using ChannelFactory = std::function<std::vector<std::shared_ptr<grpc::Channel>>(const std::string& address)>;

// A client whose replicas change while it serves (gateway/replica_discovery.h).
class DynamicSchedulerClient : public SchedulerClient {
 public:
  // The replicas from now on: new addresses are connected (through the factory) and routed to, as
  // soon as they are healthy; addresses no longer given are unlisted (requests on them finish
  // there, none is sent); an address given again after its removal is listed again.
  virtual void SetReplicas(const std::vector<std::string>& addresses) = 0;
};

std::shared_ptr<DynamicSchedulerClient> MakeDynamicSchedulerClient(const std::vector<std::string>& addresses,
                                                                   ChannelFactory factory);

}  // namespace ferry::gateway
