// The scheduler's engine loop: one thread owns the planner state and the cap
// controller and drives the workers step by step. Other threads talk to it only
// through Submit, Cancel and SetMaxNumSeqs (messages into its inbox), receive
// each request's events through the EventSink it was submitted with, and read
// State() (a snapshot the loop publishes).
#pragma once

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include <prometheus/registry.h>

#include "scheduler/cap/controller.h"
#include "scheduler/core/replica.h"
#include "scheduler/core/scheduler_core.h"
#include "scheduler/lora_table.h"

namespace ferry::scheduler {

// A worker rank is gone or hung: its stream broke (it died, restarted or the network failed) or
// it did not finish a step within the step timeout. Every sequence's state on the group is lost
// with it (the steps in flight too); nothing the engine did was wrong. The loop keeps every
// request and waits for the group to come back (WorkerGroup::Reconnect).
class WorkerLostError : public std::runtime_error {
 public:
  enum class Reason { kDisconnected, kStepTimeout };
  WorkerLostError(Reason reason, const std::string& what) : std::runtime_error(what), reason_(reason) {}
  Reason reason() const { return reason_; }
  // The metric label: "disconnected" or "step_timeout".
  const char* reason_name() const { return reason_ == Reason::kDisconnected ? "disconnected" : "step_timeout"; }

 private:
  Reason reason_;
};

// What a reconnection attempt found.
struct Reconnection {
  bool back = false;                     // every rank answers and the group may run steps again
  std::vector<int32_t> restarted_ranks;  // ranks that answered with a new incarnation (hold nothing)
  std::string detail;                    // what came back, or why the group is not back (for the log)
};

// What the loop needs of the workers; implemented over gRPC in worker_client.h.
// Workers run steps in the order sent, so the loop may send step N+1 before it
// receives step N's samples (async scheduling).
class WorkerGroup {
 public:
  virtual ~WorkerGroup() = default;
  // Sends one step to every worker. Throws WorkerLostError when a worker cannot be reached.
  virtual void Send(uint64_t step_id, const StepPlan& plan) = 0;
  // Waits for the oldest step sent and not yet received; puts its samples and prompt logprobs
  // (rank 0's) into `output`, whose contents are replaced (a reused one keeps its capacity).
  // Throws WorkerLostError when a worker is lost (every step in flight is lost with it), and
  // std::runtime_error when a worker failed the step (an engine error: the steps sent after it
  // still come).
  virtual void Receive(StepOutput& output) = 0;
  // After a WorkerLostError: asks every rank, within `timeout` each, whether it is back and fit
  // to run steps. Once it says back, the next Send starts from nothing (new streams: the workers
  // hold no sequence). A group that cannot reconnect says so in `detail`.
  virtual Reconnection Reconnect(std::chrono::milliseconds /*timeout*/) {
    return Reconnection{.detail = "this worker group cannot reconnect"};
  }
  // With no step in flight: throws WorkerLostError when a rank is gone or answers as a new
  // incarnation (it died and was restarted while the group was idle: it holds none of the
  // connection's state). Without it an idle replica would say it serves until the next step.
  virtual void CheckIdle() {}
  // LoRA adapters at run time, on every rank (all or none keep it): reads the adapter at `path` as
  // `key`. Any thread (beside Send and Receive). Throws std::invalid_argument naming what is wrong
  // with the adapter, std::runtime_error when a rank cannot be reached.
  virtual void LoadLora(const std::string& key, const std::string& /*path*/) {
    throw std::invalid_argument("lora_name \"" + key + "\": this worker group loads no adapters at run time");
  }
  // Every rank forgets `key` (one that no longer has it is fine). Throws std::runtime_error when a
  // rank cannot be reached.
  virtual void UnloadLora(const std::string& /*key*/) {}
};

// What a LoRA load or unload came to (EngineLoop::LoadLora): the gRPC status code to answer, why,
// and the adapters served after it.
struct LoraChange {
  enum class Code { kOk, kInvalidArgument, kAlreadyExists, kNotFound, kFailedPrecondition, kUnavailable };
  Code code = Code::kOk;
  std::string message;
  std::vector<std::string> names;
};

// How the loop rides out a lost worker group.
struct RecoveryOptions {
  // How long requests are kept for a lost group; then every live request ends kUnavailable and new
  // ones are refused so until it is back (--worker-recovery-timeout-s).
  Clock::duration recovery_timeout = std::chrono::seconds(120);
  // How often the group is asked whether it is back, and how long each rank may take to answer.
  Clock::duration probe_interval = std::chrono::milliseconds(250);
  std::chrono::milliseconds probe_timeout{250};
  // How often an idle loop asks the group whether it is still the one it sent steps to (CheckIdle).
  Clock::duration idle_check_interval = std::chrono::seconds(1);
  int32_t num_ranks = 1;  // ranks in the group: each gets its restart series from the start
};

struct LoopMetrics;

// Where the loop delivers requests' events: the gRPC session a request came on (scheduler_service.cc).
// Both calls come on the loop thread and must not block: a sink buffers and sends on its own time.
class EventSink {
 public:
  virtual ~EventSink() = default;
  // One event of the request submitted with `tag`, in order; its last carries a finish.
  virtual void Deliver(uint64_t tag, const SeqEvent& event) = 0;
  // The end of a batch of deliveries (a step's): what the sink holds may go out now, together.
  virtual void Flush() = 0;
};

// The batching picture, published by the loop after every step.
struct LoopState {
  int32_t max_num_seqs = 0;
  std::string controller_mode;
  std::string load_level;
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  double kv_cache_usage = 0;
  uint64_t num_preemptions = 0;
  uint64_t prefix_cache_queries = 0;
  uint64_t prefix_cache_hits = 0;
  uint64_t num_cap_changes = 0;
  uint64_t num_cap_plans = 0;  // times the controller's model planned the cap (ControllerStatus::num_plans)
  bool cap_held = false;  // an admin Set holds the cap (Controller::Set)
  // The worker group was lost and is not back: steps wait (health says NOT_SERVING).
  bool workers_lost = false;
  // LoRA adapters served (sorted), and those of the running sequences (sorted, by name).
  std::vector<std::string> lora_names;
  std::vector<std::string> running_lora_adapters;
};

class EngineLoop {
 public:
  // controller.max_num_seqs bounds the cap; config.max_num_seqs is ignored in
  // favour of it. The one-argument form runs a static cap of config.max_num_seqs.
  // config.max_steps_in_flight = 2 plans and sends step N+1 while the workers
  // run step N (async scheduling); 1 waits for each step's samples first.
  EngineLoop(const SchedulerConfig& config, const ControllerOptions& controller, WorkerGroup& workers,
             prometheus::Registry& registry, const RecoveryOptions& recovery = {});
  EngineLoop(const SchedulerConfig& config, WorkerGroup& workers, prometheus::Registry& registry);
  ~EngineLoop();

  // Queues a request whose events go to `sink` under `tag`; returns its sequence id. Throws
  // std::invalid_argument (SchedulerCore::RequestError: bad tokens, over max_model_len, more KV
  // blocks than the pool); any other refusal of the core ends it kAborted.
  uint64_t Submit(RequestSpec spec, std::shared_ptr<EventSink> sink, uint64_t tag);
  // The sequence leaves the batch at the next step and its blocks are freed.
  void Cancel(uint64_t seq_id);
  // Admin: sets the cap (clamped to the controller's bounds), held there or
  // for the adaptive modes to move (Controller::Set); returns once applied.
  LoopState SetMaxNumSeqs(int32_t max_num_seqs, bool hold);
  LoopState State() const;
  // LoRA adapters at run time (scheduler.proto's LoadLoraAdapter): reads the adapter on the workers
  // under a key of its own (lora_table.h) on the caller's thread, then serves it from the next
  // request on. Unload refuses new requests naming it at once (SeqEvent kNotFound) and has the
  // workers drop it once the requests accepted under it have ended. Both return once applied.
  LoraChange LoadLora(const std::string& name, const std::string& path);
  LoraChange UnloadLora(const std::string& name);
  // The adapters served now, sorted (SchedulerInfo.lora_names). Any thread.
  std::vector<std::string> LoraNames() const;
  // Tests: from the next turn on, every input to the loop's replica is appended to `record` (null: stop),
  // which must outlive the loop or a later call with null; returns once applied (replica.h, Replay).
  void RecordReplica(std::vector<ReplicaInput>* record);

  const SchedulerConfig& config() const { return config_; }
  // Number of requests the loop has not yet ended (for tests and metrics).
  int64_t num_live() const { return num_live_.load(); }

 private:
  struct AddCommand {
    RequestSpec spec;
    std::shared_ptr<EventSink> sink;
    uint64_t tag;
  };
  struct CancelCommand {
    uint64_t seq_id;
  };
  struct SetCapCommand {
    int32_t max_num_seqs;
    bool hold;
    std::shared_ptr<std::promise<void>> done;
  };
  struct RecordCommand {
    std::vector<ReplicaInput>* record;
    std::shared_ptr<std::promise<void>> done;
  };
  struct LoraCommand {
    std::string name;
    std::string key;   // a load's (empty: an unload)
    std::string path;
    std::shared_ptr<std::promise<LoraChange>> done;
  };
  using Command = std::variant<AddCommand, CancelCommand, SetCapCommand, RecordCommand, LoraCommand>;

  // What the loop alone knows of a request it has not ended: where its events go, and when
  // it delivered the first token (for the controller's TTFT). The rest is the core's.
  struct Stream {
    std::shared_ptr<EventSink> sink;
    uint64_t tag;
    std::optional<TimePoint> first_token;
    int32_t num_cached_tokens = 0;  // at its first scheduling (RequestCompletion::num_cached_tokens)
  };

  // A step sent to the workers whose samples the loop has not taken yet.
  struct InFlight {
    StepPlan plan;
    TimePoint sent;
  };
  InFlight PopOldest();

  void Push(Command command);
  void Run();
  void Apply(Command& command);
  void ApplyLora(LoraCommand& command);
  // A request under an adapter runs with its key (lora_table.h); false, with the request ended
  // kNotFound, when the adapter is not served (unloaded since the service checked).
  bool ResolveAdapter(AddCommand& add);
  // Ends a request the core never took: its only event, `last`, delivered and flushed at once.
  void RefuseAdd(AddCommand& add, const SeqEvent& last);
  // Retiring adapters that no live sequence names any more: the workers drop them.
  void RetireAdapters();
  // Plans a step and sends it; false if there was nothing to run.
  bool LaunchStep();
  // Takes the oldest step's samples, commits them and delivers the events.
  void CompleteStep();
  void Refuse(const std::vector<SequenceError>& refused);
  void AbortAll(const std::exception& error, uint64_t step_id);
  // The workers are gone: every request is kept for them (RequeueAll) until Recover finds them back.
  void OnWorkersLost(const WorkerLostError& error);
  // Idle for idle_check_interval: is the group still there (WorkerGroup::CheckIdle)?
  void CheckIdle();
  // While lost: deadlines, the recovery timeout, and a probe of the workers every probe_interval.
  void Recover();
  // Past the recovery timeout (once): every request kept for the lost group ends kUnavailable.
  void EndPastRecoveryTimeout(TimePoint now);
  // When the lost loop must wake next: the next probe, or the recovery timeout if sooner.
  TimePoint NextRecoveryWake() const;
  void Resume(const Reconnection& back, TimePoint now);
  // Logs and exports the controller's changes and the cap in force.
  void ReportCap(int32_t cap);
  // The cap, the controller's level and its regime on /metrics.
  void ExportCap(int32_t cap);
  // Delivers events to their sinks (ending the requests they finish); FlushSinks, at the end of
  // the loop's turn, flushes each sink that got any once.
  void Dispatch(const std::vector<SeqEvent>& events, TimePoint now);
  void FlushSinks();
  void End(const SeqEvent& last, TimePoint now);
  void Publish();
  // ferry_scheduler_lora_requests_info from the core's running and waiting adapters (with max_loras > 0).
  void PublishLoraInfo();
  std::vector<std::string> lora_running_, lora_waiting_;  // PublishLoraInfo's, kept for their capacity
  LoraTable lora_;                                       // the loop thread's
  std::atomic<uint64_t> next_lora_key_{1};               // run-time loads' keys: "<name>#<n>"
  double Seconds(TimePoint t) const { return std::chrono::duration<double>(t - start_).count(); }

  const SchedulerConfig config_;
  const RecoveryOptions recovery_;
  WorkerGroup& workers_;
  std::unique_ptr<LoopMetrics> metrics_;
  const TimePoint start_;

  std::mutex inbox_mu_;
  std::condition_variable inbox_cv_;
  std::vector<Command> inbox_;
  bool stopping_ = false;

  // Owned by the loop thread alone.
  // The planner and the cap controller (the simulator drives the same, scheduler/core/replica.h).
  Replica replica_;
  std::unordered_map<uint64_t, Stream> streams_;  // the live sequences of the replica's core
  std::vector<std::shared_ptr<EventSink>> touched_;  // sinks delivered to this turn, to flush (kept for its capacity)
  uint64_t preemptions_seen_ = 0;     // for the metric (all preemptions)
  uint64_t prefix_queries_seen_ = 0;
  uint64_t prefix_hits_seen_ = 0;
  double last_step_s_ = 0;  // the latest step's duration (a deadline's margin covers two); 0 after a loss
  Clock::duration deadline_margin_ = std::chrono::milliseconds(20);
  // Oldest first. A vector, not a deque: pops and pushes allocate nothing once it has grown.
  std::vector<InFlight> in_flight_;
  TimePoint last_received_{};  // when the previous step's samples came
  // Kept from step to step for their storage, so that a steady step allocates nothing (#26):
  // plans of committed steps (Plan reuses them), the workers' output, Commit's events.
  std::vector<StepPlan> spare_plans_;
  StepOutput output_;
  std::vector<SeqEvent> events_;

  // A lost worker group (the loop thread's): since when, whether the recovery timeout has passed
  // (live requests ended kUnavailable, new ones refused), the next probe, the requests kept.
  bool lost_ = false;
  bool down_ = false;
  TimePoint lost_at_{};
  TimePoint next_probe_{};
  TimePoint next_waiting_log_{};
  std::vector<uint64_t> kept_ids_;

  mutable std::mutex state_mu_;
  LoopState state_;  // guarded by state_mu_

  std::atomic<uint64_t> next_seq_id_{1};
  std::atomic<int64_t> num_live_{0};
  std::thread thread_;
};

}  // namespace ferry::scheduler
