// gRPC side of WorkerGroup: one long-lived Step stream per worker rank.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "ferry/v1/worker.grpc.pb.h"
#include "scheduler/engine_loop.h"

namespace ferry::scheduler {

class GrpcWorkerGroup final : public WorkerGroup {
 public:
  // addresses: "host:port" of each tensor-parallel rank, rank 0 first.
  explicit GrpcWorkerGroup(std::vector<std::string> addresses);
  ~GrpcWorkerGroup() override;

  // Waits until every worker answers Info (they may still be loading weights),
  // up to timeout; returns rank 0's info, with the fewest KV blocks of any rank and each
  // supports_* flag set only when every rank sets it. Throws std::runtime_error on timeout.
  ferry::v1::WorkerInfo WaitForInfo(std::chrono::seconds timeout);

  // Writes the step to every rank's stream (opened on first use and after a
  // failure); a rank reads it when done with the steps before.
  void Send(uint64_t step_id, const StepPlan& plan) override;
  // Reads one result from every rank, in rank order; on a failure the streams
  // close (the next Send opens new ones, and a worker forgets every sequence
  // when a new stream opens).
  void Receive(StepOutput& output) override;
  // Whether each rank answers Health within timeout, rank 0 first (every rank is asked, even
  // after one fails). Thread-safe: only uses the stubs.
  std::vector<bool> HealthyRanks(std::chrono::milliseconds timeout) const;

 private:
  struct Rank;
  void OpenStreams();
  void CloseStreams();

  std::vector<std::unique_ptr<Rank>> ranks_;
  ferry::v1::StepRequest request_;  // Send's, reused: a cleared message keeps its elements
};

// Domain -> proto translation, exposed for tests. The second form fills `request` (cleared
// first; its repeated fields' elements and storage are reused, so a steady step allocates nothing).
ferry::v1::StepRequest ToStepRequest(uint64_t step_id, const StepPlan& plan);
void ToStepRequest(uint64_t step_id, const StepPlan& plan, ferry::v1::StepRequest& request);
// Proto -> domain: `output` (contents replaced, capacity kept) gets the samples and prompt
// logprobs of `result`.
void FromStepResult(const ferry::v1::StepResult& result, StepOutput& output);

}  // namespace ferry::scheduler
