// Runs the lines of the Batch API's batches (gateway/store): claims them under a lease, runs each
// through `execute` (the HTTP front's own handler for the batch's endpoint, on the batch lane),
// records its answer with the store's compare-and-set, renews the leases of the lines it holds,
// and finalizes the batches that are done, cancelled or expired. Any number of gateways may run
// one over the same database: a line is completed once (gateway/store/README.md), and a gateway
// that dies leaves its lines to whoever claims them after their lease runs out.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gateway/store/batch_store.h"
#include "gateway/store/file_store.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace ferry::gateway {

// What running one line gave: the endpoint's HTTP status and body.
struct LineAnswer {
  int status = 0;        // HTTP status; 0: the gateway is shutting down (the line is left to a later claim)
  std::string body;      // the JSON body
  int64_t retry_after_ms = 0;  // 429/503: when to try again
};

struct BatchRunnerOptions {
  std::string owner;              // unique per gateway process (a restarted gateway takes a new one)
  int concurrency = 64;           // lines run at once (--batch-concurrency)
  double lease_s = 60;            // a claim's lease; renewed every lease_s / 4 while the line runs
  double idle_poll_s = 1;         // how often an idle runner looks for new lines (other gateways' batches)
  double retention_s = 0;         // files older are deleted (--file-retention-s); 0 keeps them
  // ferry_gateway_store_* (the store's rows, read every stats_every_s) and
  // ferry_gateway_batch_lines_total (this gateway's lines) when set.
  prometheus::Registry* registry = nullptr;
  double stats_every_s = 5;
};

class BatchRunner {
 public:
  using Execute = std::function<LineAnswer(const store::ClaimedItem&)>;
  BatchRunner(store::BatchStore& batches, store::FileStore& files, BatchRunnerOptions options, Execute execute);
  ~BatchRunner();

  void Start();
  // Claims now rather than at the next poll (a batch was just created).
  void Wake();
  // Stops claiming; from now on a line whose answer is not a success is left leased for a later
  // claim (a drain cancels the lines running: their answers say so, not what the line would
  // give). Returns at once.
  void BeginStop();
  // BeginStop, then joins every thread (each waits for its line's answer).
  void Stop();

  // Lines this runner holds now (claimed and not yet recorded).
  int64_t in_flight() const;

  // How one answer is recorded: 2xx completes the line; a retryable refusal (429, 503) runs it
  // again after its hint; any other status fails it, the answer in the error file.
  enum class Outcome { kComplete, kFail, kRetry, kAbandon };
  static Outcome Classify(const LineAnswer& answer);

 private:
  void DispatchLoop();  // claims lines into queue_, renews leases, finalizes
  void WorkLoop();      // runs lines from queue_
  void RunLine(const store::ClaimedItem& item);
  void Maintain(double now);
  void Record(const char* outcome);  // ferry_gateway_batch_lines_total

  struct Metrics;
  bool stopping() const { return stopping_.load(); }

  store::BatchStore& batches_;
  store::FileStore& files_;
  const BatchRunnerOptions options_;
  const Execute execute_;
  std::unique_ptr<Metrics> metrics_;  // null without a registry
  double stats_read_at_ = 0;          // dispatcher thread only

  mutable std::mutex mu_;
  std::condition_variable work_cv_;            // queue_ has lines, or a stop
  std::condition_variable dispatch_cv_;        // a slot freed, a wake or a stop (and retry waits)
  std::deque<store::ClaimedItem> queue_;       // claimed, not yet started
  std::set<std::string> held_;                 // claimed and not recorded: the leases to renew
  bool wake_ = false;
  std::atomic<bool> stopping_{false};
  std::thread dispatcher_;
  std::vector<std::thread> workers_;
};

}  // namespace ferry::gateway
