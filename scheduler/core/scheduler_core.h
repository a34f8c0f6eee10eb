// The scheduler core: continuous batching over a fixed KV block pool. A pure
// planner: no threads, sockets, clocks or CUDA. The service around it owns the
// loop and calls, from one thread:
//
//   Add / Cancel            at any time
//   plan = Plan(budget, now); deliver TakeEvents()   (first schedulings, deadline ends)
//   if (!plan.empty()) { send plan; events = Commit(plan, result.sampled); }
//   on a step error:        events = AbortAll()
//   on a lost worker:       RequeueAll(); plan again once a worker is back
//                           (ExpireDeadlines meanwhile)
//
// With config.max_steps_in_flight = 2 the caller may plan and send step N+1
// before it commits step N (the worker runs steps in order); commits stay in
// step order.
//
// See scheduler/core/README.md for the contract and invariants.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "scheduler/core/policies.h"
#include "scheduler/core/types.h"

namespace ferry::scheduler {

// One `LANE=MS` flag value (ferry-scheduler's and ferry-sim's --lane-ttft-ms).
// Throws std::invalid_argument naming the value unless LANE is non-empty and
// MS a number > 0.
LaneTtft ParseLaneTtft(const std::string& spec);

class SchedulerCore {
 public:
  // Throws std::invalid_argument on a non-positive size in `config`.
  explicit SchedulerCore(const SchedulerConfig& config);

  // Queues a request. Throws std::invalid_argument (naming field, value and
  // limit) for a live duplicate seq_id or what RequestError finds.
  void Add(RequestSpec request);
  // Add's checks that need no state: an empty prompt, a negative token id, max_tokens < 1,
  // prompt + max_tokens over max_model_len, or a full length needing more KV blocks than the pool
  // has. "" if none, else the error naming field, value and limit; so a caller may refuse a
  // request before it queues it.
  static std::string RequestError(const RequestSpec& request, const SchedulerConfig& config);
  // Removes the sequence and frees its blocks now. If the worker holds state
  // for it, its id goes into the next plan's finished_ids. Unknown ids are ignored.
  void Cancel(uint64_t seq_id);
  // Decides the next step. Every non-empty plan must be sent and then passed to
  // Commit, in order (the plan is empty while a step in flight speculates: it waits for that
  // Commit); at most config.max_steps_in_flight plans may await their
  // Commit when Plan is called (std::logic_error otherwise). `now` drives
  // deadlines (sequences whose deadline or, never sent, queue deadline is <= now
  // end first; their events wait in TakeEvents), aging, and the time of first
  // schedulings. Throws std::invalid_argument on a budget with a non-positive limit.
  // The plan goes into `plan`, whose contents are discarded and whose storage (the vectors, the
  // block id vectors of its entries) is reused: with the plans of earlier, committed steps passed
  // back in (never one still awaiting its Commit), a steady decode step allocates nothing.
  void Plan(const Budget& budget, TimePoint now, StepPlan& plan);
  StepPlan Plan(const Budget& budget, TimePoint now) {
    StepPlan plan;
    Plan(budget, now, plan);
    return plan;
  }
  // Events produced outside Commit since the last call, in the order they happened:
  // from Plan, deadline ends (kDeadlineExceeded / kTimeout) and then an event for each
  // sequence sent for the first time (first_scheduled set); none has tokens.
  std::vector<SeqEvent> TakeEvents() { return std::exchange(events_, {}); }
  // Applies the worker's samples for `plan`, the oldest step in flight. Every
  // scheduled, still-live sequence whose step reached the end of its known
  // tokens needs exactly one sample, and no other sequence may have one
  // (std::invalid_argument, state unchanged). Samples for sequences ended since
  // Plan are ignored; a sequence preempted since keeps its sample. Puts into `events` (cleared
  // first; a reused vector keeps its capacity) one event per sequence that got a token, in plan
  // order.
  void Commit(const StepPlan& plan, const std::vector<SampledToken>& sampled,
              const std::vector<PromptLogprobs>& prompt_logprobs, std::vector<SeqEvent>& events);
  std::vector<SeqEvent> Commit(const StepPlan& plan, const std::vector<SampledToken>& sampled,
                               const std::vector<PromptLogprobs>& prompt_logprobs = {}) {
    std::vector<SeqEvent> events;
    Commit(plan, sampled, prompt_logprobs, events);
    return events;
  }
  // Ends every live sequence with `kind` (ordered by seq_id) and frees all
  // blocks; any step in flight is forgotten. Ids the worker held go into the
  // next plan's finished_ids (a replacement worker should ignore unknown ids).
  std::vector<SeqEvent> AbortAll(FinishKind kind = FinishKind::kAborted);
  // The workers lost all state (one died or hung; its replacement holds nothing): every live
  // sequence is kept and goes back to waiting, as a preemption by recompute would send it, in
  // front of its priority and in service order. Tokens sampled by steps in flight are forgotten:
  // they were never delivered, and the resumed sequence samples them again at the same positions
  // of its random stream, so greedy and seeded outputs are unchanged. The KV pool and the prefix
  // cache are emptied, and steps in flight and pending finished ids are forgotten (the new
  // workers never saw them). Not counted as preemptions (no sign of KV pressure). Returns the
  // number of sequences kept.
  int32_t RequeueAll();
  // Ends the sequences whose deadline (or queue deadline) is <= now, as Plan does first; their
  // events wait in TakeEvents. For when no step can be planned (the workers are lost).
  void ExpireDeadlines(TimePoint now);

  int32_t num_waiting() const { return static_cast<int32_t>(state_.waiting.size()); }
  // The waiting queue's order: "priority" and the rules on (queue_order.h).
  const std::string& queue_order() const { return state_.order.name(); }
  // What a computed prompt token costs now (QueueOrder::SetPrefillSecondsPerToken): the caller's
  // measurement, as the cap is; the core keeps no clock.
  void SetPrefillSecondsPerToken(double seconds) { state_.order.SetPrefillSecondsPerToken(seconds); }
  int32_t num_running() const { return static_cast<int32_t>(state_.running.size()); }
  // Waiting requests of the lanes in `lanes` (empty: every lane): a scan of
  // the queue (the goodput controller's demand per lane class). Those a queue
  // rule defers at `now` (late-last: past their first_token_target) are
  // counted apart, as late (they are served after the rest).
  struct WaitingCount {
    int32_t on_time = 0;
    int32_t late = 0;
  };
  WaitingCount NumWaitingIn(const std::vector<std::string>& lanes, TimePoint now) const;
  // Allocatable blocks: free plus cached ones no sequence holds.
  int32_t num_free_blocks() const { return state_.blocks.num_free_blocks(); }
  int32_t num_total_blocks() const { return state_.blocks.num_total_blocks(); }
  uint64_t num_steps() const { return num_steps_; }  // non-empty plans issued
  uint64_t num_preemptions() const { return state_.num_preemptions; }
  // Of num_preemptions, those that made room for a waiting request of higher
  // effective priority (not a sign of KV pressure).
  uint64_t num_priority_preemptions() const { return state_.num_priority_preemptions; }
  // Prefix cache counters, in blocks: looked up at admission / reused.
  uint64_t num_prefix_cache_queries() const { return state_.num_prefix_cache_queries; }
  uint64_t num_prefix_cache_hits() const { return state_.num_prefix_cache_hits; }
  // Blocks published in the prefix cache (held or evictable).
  int32_t num_cached_blocks() const { return state_.blocks.num_cached_blocks(); }
  bool is_live(uint64_t seq_id) const { return state_.sequences.contains(seq_id); }
  // Calls fn(seq_id) for every live sequence, in no particular order.
  template <typename Fn>
  void ForEachLive(Fn&& fn) const {
    for (const auto& entry : state_.sequences) fn(entry.first);
  }
  // The distinct LoRA adapters of the running and of the waiting sequences, each sorted (vLLM's
  // lora_requests_info); cleared first. Walks every live sequence: for metrics, not per plan.
  void LoraAdapters(std::vector<std::string>& running, std::vector<std::string>& waiting) const;
  // Anything to plan: waiting or running sequences, or finished ids to send.
  bool has_work() const;
  bool is_step_in_flight() const { return num_in_flight_ > 0; }
  int32_t num_steps_in_flight() const { return static_cast<int32_t>(num_in_flight_); }
  // The sequence's block table (empty if not live or holding no blocks).
  std::span<const BlockId> block_ids(uint64_t seq_id) const;
  const SchedulerConfig& config() const { return state_.config; }

  // Verifies the invariants in README.md; throws std::logic_error naming the
  // first broken one. O(blocks + sequences): for tests and debug checks.
  void CheckInvariants() const;

 private:
  // What Commit needs of a planned step: per scheduled sequence, whether it
  // samples, how far its KV reaches once the step ran, and which admission of
  // it the step belongs to (a sequence preempted since publishes nothing).
  struct PlannedEntry {
    uint64_t seq_id = 0;
    bool samples = false;
    int32_t computed_after = 0;
    uint64_t start_order = 0;
    int32_t lookahead = 0;  // draft slots: it may get up to 1 + lookahead samples
  };
  struct InFlightStep {
    uint64_t step_id = 0;
    std::vector<PlannedEntry> entries;
  };
  static constexpr size_t kMaxStepsInFlight = 4;  // config.max_steps_in_flight's bound

  InFlightStep& oldest_in_flight() { return in_flight_[in_flight_head_]; }
  const InFlightStep& oldest_in_flight() const { return in_flight_[in_flight_head_]; }
  Sequence* Find(uint64_t seq_id) const;
  // Advances every scheduled sequence past its tokens in `plan` (a pending
  // token for each that samples) and records the step as in flight.
  void Launch(const StepPlan& plan);
  // Sequences of `plan` sent for the first time: their queue deadline lapses and their event is queued.
  void MarkSent(const StepPlan& plan, TimePoint now);
  // Fills sample_index_ for `sampled`.
  void IndexSamples(const std::vector<SampledToken>& sampled);
  // The position in `sampled` of the sample for `seq_id`, and how many there are (0: none).
  std::pair<size_t, int32_t> FindSample(uint64_t seq_id) const;
  // Needs IndexSamples(sampled) first.
  void ValidateCommit(const StepPlan& plan, const std::vector<SampledToken>& sampled) const;
  // Writes the sequence's samples of one step, the first over its oldest pending token, the
  // others (accepted drafts' successors) after it; returns the event, and retires the sequence
  // at the first token that ends it (the rest are dropped).
  SeqEvent ApplySamples(Sequence& seq, std::span<const SampledToken> samples);
  // A speculative step's Commit: the sequence may be planned again, its accepted drafts count as
  // computed and the slots of rejected ones are rolled back. Before its samples are applied.
  void EndSpeculation(Sequence& seq, const PlannedEntry& entry, int32_t num_samples);
  // The entries of `from` not forwarded before (a recomputed sequence scores its prompt again),
  // appended to `to`; advances seq.next_prompt_logprob.
  static void TakeNewPromptLogprobs(Sequence& seq, const PromptLogprobs& from, std::vector<TokenLogprob>& to);
  // Removes a live sequence (its lease frees the blocks); `seq` dangles after.
  void Retire(Sequence& seq);
  void CheckSequence(const Sequence& seq) const;

  SchedulerState state_;
  std::vector<SeqEvent> events_;
  // Steps planned and not committed, a ring from in_flight_head_, oldest first. Its slots keep
  // their entries' capacity from step to step.
  std::array<InFlightStep, kMaxStepsInFlight> in_flight_;
  size_t in_flight_head_ = 0;
  size_t num_in_flight_ = 0;
  uint64_t num_steps_ = 0;
  PlanBuffers plan_buffers_;
  // Commit's (seq_id, position in its samples), sorted: a sequence's sample is found without a
  // hash map built per step.
  std::vector<std::pair<uint64_t, size_t>> sample_index_;
};

}  // namespace ferry::scheduler
