// gRPC adapter of the worker: translates ferry.v1 step messages to the engine's
// domain types (worker/model/model_runner.h) and back. No decisions here.
#pragma once

#include <mutex>

#include <prometheus/registry.h>

#include "ferry/v1/worker.grpc.pb.h"
#include "worker/device_metrics.h"
#include "worker/model/model_runner.h"

namespace ferry::worker {

struct WorkerMetrics;

class WorkerService final : public ferry::v1::Worker::Service {
 public:
  // device (optional): told when each step begins and ends (its busy ratio).
  WorkerService(ModelRunner& runner, prometheus::Registry& registry, DeviceMetrics* device = nullptr);
  ~WorkerService() override;

  grpc::Status Info(grpc::ServerContext*, const ferry::v1::WorkerInfoRequest*,
                    ferry::v1::WorkerInfo* out) override;
  grpc::Status Step(grpc::ServerContext* context,
                    grpc::ServerReaderWriter<ferry::v1::StepResult, ferry::v1::StepRequest>* stream) override;
  grpc::Status Health(grpc::ServerContext*, const ferry::v1::HealthRequest*,
                      ferry::v1::HealthResponse* out) override;

 private:
  ferry::v1::StepResult Execute(const ferry::v1::StepRequest& request);

  // Drawn at construction (one per process start; never 0): Info and Health report it, so a
  // scheduler tells a restarted rank, which holds nothing, from the one it lost.
  const uint64_t incarnation_id_;

  ModelRunner& runner_;
  // The runner is single-threaded; a second Step stream (a reconnecting
  // scheduler) waits here rather than interleaving steps.
  std::mutex step_mutex_;
  std::unique_ptr<WorkerMetrics> metrics_;
  DeviceMetrics* device_;
};

// Proto -> domain translation, exposed for tests.
StepSpec ToStepSpec(const ferry::v1::StepRequest& request);

}  // namespace ferry::worker
