// gRPC side of WorkerGroup: one long-lived Step stream per worker rank.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "ferry/v1/worker.grpc.pb.h"
#include "common/tls.h"
#include "scheduler/engine_loop.h"

namespace ferry::scheduler {

// How long a step may take before its group is declared lost (--step-timeout-s). The first steps
// of each connection get longer: a fresh worker may compile kernels or capture graphs in them.
struct StepTimeouts {
  std::chrono::milliseconds step{std::chrono::seconds(60)};
  std::chrono::milliseconds first_steps{std::chrono::seconds(300)};
  int32_t num_first_steps = 3;
};

class GrpcWorkerGroup final : public WorkerGroup {
 public:
  // addresses: "host:port" of each tensor-parallel rank, rank 0 first.
  // tls: the scheduler's identity and the CA the workers' certificates chain to (plaintext unless
  // --tls-ca is set).
  explicit GrpcWorkerGroup(std::vector<std::string> addresses, StepTimeouts timeouts = {}, const TlsFlags& tls = {});
  ~GrpcWorkerGroup() override;

  // Waits until every worker answers Info (they may still be loading weights),
  // up to timeout; returns rank 0's info, with the fewest KV blocks of any rank and each
  // supports_* flag set only when every rank sets it. Throws std::runtime_error on timeout.
  ferry::v1::WorkerInfo WaitForInfo(std::chrono::seconds timeout);

  // Writes the step to every rank's stream (opened on first use and after a
  // failure); a rank reads it when done with the steps before.
  void Send(uint64_t step_id, const StepPlan& plan) override;
  // Reads one result from every rank, in rank order; when a stream breaks or the oldest step
  // outlives its timeout (a watchdog cancels the streams), every stream closes and
  // WorkerLostError says which rank and why (the next Send opens new streams, and a worker
  // forgets every sequence when a new stream opens).
  void Receive(StepOutput& output) override;
  // Every rank must answer Info and Health (ok) within `timeout`, serve what the replica was
  // planned for (model, block size, vocabulary, at least its KV blocks and length), and, in a
  // tensor-parallel group, all ranks or none must be new incarnations (a rank that restarted
  // alone cannot rejoin a group whose collectives it never joined), and no rank may still run a
  // step of the lost connection (a slow worker after a step timeout: new steps would wait behind
  // it).
  Reconnection Reconnect(std::chrono::milliseconds timeout) override;
  // Asks every rank for Info, each within the step timeout: a rank that does not answer (it is
  // gone, or hung past the step timeout) or answers as a new incarnation loses the group.
  void CheckIdle() override;
  // Whether each rank answers Health within timeout, rank 0 first (every rank is asked, even
  // after one fails). Thread-safe: only uses the stubs.
  std::vector<bool> HealthyRanks(std::chrono::milliseconds timeout) const;
  // Worker.LoadLoraAdapter on every rank, in rank order; when one refuses, the ranks that loaded it
  // unload it again. Thread-safe: only uses the stubs.
  void LoadLora(const std::string& key, const std::string& path) override;
  void UnloadLora(const std::string& key) override;

 private:
  struct Rank;
  ferry::v1::WorkerInfo WaitForEveryRank(std::chrono::seconds timeout);
  void OpenStreams();
  // Cancels every stream first: a stopped worker would never answer WritesDone or Finish.
  void CloseStreams();
  // Closes the streams and says why the rank was lost (a stream broke, or the watchdog fired).
  [[noreturn]] void Lost(size_t rank, const char* what);
  void Watch();

  std::vector<std::unique_ptr<Rank>> ranks_;
  ferry::v1::StepRequest request_;  // Send's, reused: a cleared message keeps its elements
  const StepTimeouts timeouts_;
  ferry::v1::WorkerInfo planned_;          // what WaitForInfo found: the replica is planned for it
  std::vector<uint64_t> incarnations_;     // each rank's, as last connected

  // The watchdog: steps sent and not received (their ids; when each may begin: sent, or the
  // previous one done), the rank Receive waits for, and whether it fired. Guarded by watch_mu_,
  // with the stream contexts it cancels.
  struct Pending {
    uint64_t step_id;
    std::chrono::steady_clock::time_point sent;
    bool first;  // among the first steps of its connection
  };
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  std::vector<Pending> pending_;  // oldest first; a vector: no allocation once grown
  std::chrono::steady_clock::time_point last_done_{};
  int32_t steps_on_streams_ = 0;
  size_t reading_rank_ = 0;
  bool timed_out_ = false;
  std::string timeout_what_;
  bool stopping_ = false;
  std::thread watchdog_;
};

// Domain -> proto translation, exposed for tests. The second form fills `request` (cleared
// first; its repeated fields' elements and storage are reused, so a steady step allocates nothing).
ferry::v1::StepRequest ToStepRequest(uint64_t step_id, const StepPlan& plan);
void ToStepRequest(uint64_t step_id, const StepPlan& plan, ferry::v1::StepRequest& request);
// Proto -> domain: `output` (contents replaced, capacity kept) gets the samples and prompt
// logprobs of `result`.
void FromStepResult(const ferry::v1::StepResult& result, StepOutput& output);

}  // namespace ferry::scheduler
