// gRPC adapter of the worker: translates ferry.v1 step messages to the engine's
// domain types (worker/engine/model_runner.h) and back. No decisions here.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <prometheus/registry.h>

#include "ferry/v1/worker.grpc.pb.h"
#include "worker/device_metrics.h"
#include "worker/engine/model_runner.h"

namespace ferry::worker {

struct WorkerMetrics;

struct WorkerServiceOptions {
  DeviceMetrics* device = nullptr;  // optional: told when each step begins and ends (its busy ratio)
  // --step-timeout-s: > 0, Health fails while a step has run longer than this (a supervisor's
  // liveness probe then restarts the worker); 0: off.
  int step_timeout_s = 0;
  // Called on the step thread when a step fails with CommError (the tensor-parallel group is
  // broken), after Health has started to report `reason`. ferry-worker exits the process there,
  // before the step's answer is written: the scheduler sees the rank lost, not a failed step.
  // Unset, or when it returns (tests), the step answers with the error.
  std::function<void(const std::string& reason)> on_group_failure;
};

// What Health reads of the step thread: the running step and a broken group. Its own lock, as
// Health runs on gRPC threads while a step runs.
class StepWatch {
 public:
  using Clock = std::chrono::steady_clock;
  void Began(uint64_t step_id, Clock::time_point now);
  void Ended();
  void Broke(const std::string& reason);  // sticky
  // Empty while nothing is wrong, else why the worker should be restarted.
  std::string Problem(Clock::time_point now, int step_timeout_s) const;
  // Seconds the oldest running step has run; 0 when none runs.
  double RunningSeconds(Clock::time_point now) const;

 private:
  // The first steps of a process may compile kernels or capture graphs: they get 5x the timeout,
  // as the scheduler gives them.
  static constexpr int kNumFirstSteps = 3;
  static constexpr int kFirstStepsFactor = 5;

  struct Running {
    uint64_t step_id = 0;
    Clock::time_point start;
    bool first = false;  // one of the first kNumFirstSteps
  };
  mutable std::mutex mutex_;
  std::deque<Running> running_;  // begun and not ended, oldest first (two with an overlapping runner)
  int num_began_ = 0;
  std::string broken_;
};

class WorkerService final : public ferry::v1::Worker::Service {
 public:
  WorkerService(ModelRunner& runner, prometheus::Registry& registry, WorkerServiceOptions options = {});
  ~WorkerService() override;

  // Empty while the worker can serve; else the reason Health reports (the engine failed, the
  // group broke, a step is over --step-timeout-s). Any thread.
  std::string HealthProblem() const;

  grpc::Status Info(grpc::ServerContext*, const ferry::v1::WorkerInfoRequest*,
                    ferry::v1::WorkerInfo* out) override;
  grpc::Status Step(grpc::ServerContext* context,
                    grpc::ServerReaderWriter<ferry::v1::StepResult, ferry::v1::StepRequest>* stream) override;
  grpc::Status Health(grpc::ServerContext*, const ferry::v1::HealthRequest*,
                      ferry::v1::HealthResponse* out) override;
  grpc::Status LoadLoraAdapter(grpc::ServerContext*, const ferry::v1::LoadLoraAdapterRequest* request,
                               ferry::v1::LoraAdaptersResponse* out) override;
  grpc::Status UnloadLoraAdapter(grpc::ServerContext*, const ferry::v1::UnloadLoraAdapterRequest* request,
                                 ferry::v1::LoraAdaptersResponse* out) override;

 private:
  struct Submitted;
  ferry::v1::StepResult Execute(const ferry::v1::StepRequest& request);
  void RunOverlapped(grpc::ServerContext* context,
                     grpc::ServerReaderWriter<ferry::v1::StepResult, ferry::v1::StepRequest>* stream);
  Submitted Submit(const ferry::v1::StepRequest& request);
  ferry::v1::StepResult Collect(Submitted& submitted);
  StepWatch::Clock::time_point Began(uint64_t step_id);
  void Ended(StepWatch::Clock::time_point start, ferry::v1::StepResult* result);
  void Answer(const StepSpec& spec, const std::vector<SampledTokenOut>& samples, ferry::v1::StepResult* result);
  // Takes out of `spec` each new sequence the runner's checks refuse (ValidateNew), with every mention of a
  // sequence refused before, and answers each refusal in `errors` alone (StepResult.sequence_errors): one bad
  // sequence fails by itself, not the step. Every rank screens alike (the checks read only the request and
  // the model's facts), so a tensor-parallel group runs the same step.
  void Screen(StepSpec& spec, google::protobuf::RepeatedPtrField<ferry::v1::SequenceError>* errors);
  // The step's error text; counts it, and hands a broken group to on_group_failure.
  std::string Failed(uint64_t step_id, const std::exception& e);
  std::string OnGroupFailure(uint64_t step_id, const std::exception& e);

  // Drawn at construction (one per process start; never 0): Info and Health report it, so a
  // scheduler tells a restarted rank, which holds nothing, from the one it lost.
  const uint64_t incarnation_id_;
  // Sequences Screen refused, until a step's finished_ids names them (the scheduler's second step in flight
  // may still schedule one); emptied with the runner's sequences when a scheduler connects.
  std::unordered_set<uint64_t> refused_;

  ModelRunner& runner_;
  // The runner is single-threaded; a second Step stream (a reconnecting
  // scheduler) waits here rather than interleaving steps.
  std::mutex step_mutex_;
  std::unique_ptr<WorkerMetrics> metrics_;
  const WorkerServiceOptions options_;
  StepWatch watch_;
  int num_outstanding_ = 0;  // steps begun and not ended (the step thread's only)
  StepWatch::Clock::time_point last_step_end_;  // when the last step was answered (step thread)
};

// Proto -> domain translation, exposed for tests.
StepSpec ToStepSpec(const ferry::v1::StepRequest& request);

}  // namespace ferry::worker
