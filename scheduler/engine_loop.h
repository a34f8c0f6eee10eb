// The scheduler's engine loop: one thread owns the planner state and drives
// the workers step by step. Other threads talk to it only through Submit and
// Cancel (messages into its inbox) and read results from RequestChannels.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include <prometheus/registry.h>

#include "scheduler/core/scheduler_core.h"
#include "scheduler/request_channel.h"

namespace ferry::scheduler {

// What the loop needs of the workers; implemented over gRPC in worker_client.h.
class WorkerGroup {
 public:
  virtual ~WorkerGroup() = default;
  // Runs one step on every worker and returns the samples (rank 0's). Throws
  // std::runtime_error when a worker fails the step or cannot be reached.
  virtual std::vector<SampledToken> Execute(uint64_t step_id, const StepPlan& plan) = 0;
};

struct LoopMetrics;

class EngineLoop {
 public:
  EngineLoop(const SchedulerConfig& config, WorkerGroup& workers, prometheus::Registry& registry);
  ~EngineLoop();

  // Queues a request; returns its sequence id and the channel its events
  // arrive on. Throws std::invalid_argument naming the field and the limit.
  std::pair<uint64_t, std::shared_ptr<RequestChannel>> Submit(RequestSpec spec);
  // The sequence leaves the batch at the next step and its blocks are freed.
  void Cancel(uint64_t seq_id);

  const SchedulerConfig& config() const { return config_; }
  // Number of requests the loop has not yet ended (for tests and metrics).
  int64_t num_live() const { return num_live_.load(); }

 private:
  struct AddCommand {
    RequestSpec spec;
    std::shared_ptr<RequestChannel> channel;
  };
  struct CancelCommand {
    uint64_t seq_id;
  };
  using Command = std::variant<AddCommand, CancelCommand>;

  void Run();
  void DrainInbox(std::vector<Command>& commands);
  void Apply(Command& command);
  void RunStep();
  void Dispatch(const std::vector<SeqEvent>& events);
  void UpdateGauges();

  const SchedulerConfig config_;
  WorkerGroup& workers_;
  std::unique_ptr<LoopMetrics> metrics_;

  std::mutex inbox_mu_;
  std::condition_variable inbox_cv_;
  std::vector<Command> inbox_;
  bool stopping_ = false;

  // Owned by the loop thread alone.
  SchedulerCore core_;
  std::unordered_map<uint64_t, std::shared_ptr<RequestChannel>> channels_;

  std::atomic<uint64_t> next_seq_id_{1};
  std::atomic<int64_t> num_live_{0};
  std::thread thread_;
};

}  // namespace ferry::scheduler
