// The gateway's gRPC client of its scheduler replicas: scheduler_client.h over ferry.v1.Scheduler
// stubs. Each Submit stream is a callback reactor (a thread per stream on both sides spent about
// half of the gateway's CPU switching threads, docs/benchmarks/bench.md 2e); the router's health
// checks ask each replica's GetState.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/channel.h>

#include "gateway/scheduler_client.h"

namespace ferry::gateway {

// channels[i] reaches replica i, at addresses[i] (for logs).
std::shared_ptr<SchedulerClient> MakeGrpcSchedulerClient(std::vector<std::shared_ptr<grpc::Channel>> channels,
                                                         const std::vector<std::string>& addresses);

}  // namespace ferry::gateway
