// Scheduler-side state of one sequence, and the waiting queue. Internal to
// scheduler/core: the facade and the policies share these; callers never see them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <span>
#include <vector>

#include "scheduler/core/block_manager.h"
#include "scheduler/core/queue_order.h"
#include "scheduler/core/types.h"

namespace ferry::scheduler {

// Stands in `Sequence::tokens` for a token a step in flight samples; the
// commit of that step writes the real one.
constexpr int32_t kPendingToken = -1;

struct Sequence {
  Sequence(RequestSpec request, KvLease kv) : spec(std::move(request)), lease(std::move(kv)) {
    tokens = spec.prompt;
    tokens.insert(tokens.end(), spec.generated.begin(), spec.generated.end());
    effective_priority = spec.priority;
  }

  int32_t num_tokens() const { return static_cast<int32_t>(tokens.size()); }
  int32_t num_prompt_tokens() const { return static_cast<int32_t>(spec.prompt.size()); }
  int32_t num_generated() const { return num_tokens() - num_prompt_tokens(); }
  int32_t num_uncomputed() const { return num_tokens() - num_computed; }
  // One token left to compute: it runs as a decode and samples.
  bool is_decode() const { return num_uncomputed() == 1; }
  bool has_started() const { return start_order != 0; }
  // When it ends unless it finished first; the queue deadline holds until it is first sent.
  // Never started and already past its first-token target (SchedulerConfig::serve_late_last).
  bool IsLate(TimePoint now) const { return !is_sent && now > spec.first_token_target; }
  TimePoint deadline() const { return is_sent ? spec.deadline : std::min(spec.deadline, spec.queue_deadline); }
  // Its pending tokens already end it by length: it must not run again (the
  // commit that brings them retires it).
  bool is_finishing(int32_t max_model_len) const {
    return num_pending > 0 && (num_generated() >= spec.max_tokens || num_tokens() >= max_model_len);
  }
  // Chained hashes of the first `num_blocks` full blocks of `tokens` (computed
  // once; tokens only ever grow). Precondition: that many full blocks exist.
  std::span<const uint64_t> BlockHashes(int32_t num_blocks, int32_t block_size);
  // Drops what the worker held: blocks, progress and the published chain.
  void ResetProgress();

  RequestSpec spec;
  // Prompt, then every sampled token; the last num_pending are kPendingToken
  // (sampled by steps in flight, in step order).
  std::vector<int32_t> tokens;
  int32_t num_pending = 0;
  // Tokens whose KV the worker holds in `lease` once the planned steps ran
  // (advanced by Plan; a speculative step's accepted drafts are added at its Commit).
  int32_t num_computed = 0;
  // Draft slots the lease holds past num_computed for the speculative step in flight (0: none).
  // Invariant: lease covers exactly [0, num_computed + num_lookahead).
  int32_t num_lookahead = 0;
  // A step in flight may sample several tokens for it (it had lookahead slots): it is not planned
  // again until that step's Commit says how many.
  bool is_speculating = false;
  KvLease lease;
  // The worker holds state for this sequence: it was sent in new_sequences and
  // not since in preempted_ids. Decides finished_ids and re-sending.
  bool is_on_worker = false;
  bool is_sent = false;  // sent in new_sequences at least once (it left the queue)
  uint64_t start_order = 0;  // when last admitted; larger == more recent; 0: never
  int32_t num_preemptions = 0;
  int32_t lane_index = -1;  // index in config.lane_reservations; -1: no reservation
  // spec.priority plus aging, as of the current Plan (ServesBefore uses it).
  int64_t effective_priority = 0;
  // Prefix caching: hashes of full blocks, and how far the lease's blocks are
  // published (or found equal to a cached block).
  std::vector<uint64_t> block_hashes;
  int32_t num_published_blocks = 0;
  // prompt_logprobs: the prompt index whose logprob is forwarded next (index 0 has none).
  int32_t next_prompt_logprob = 1;
  BlockId last_published = kNoBlock;  // the cached block standing for block num_published - 1
  bool is_publishing_stopped = false;  // a hash collision with a held block
  std::multimap<TimePoint, uint64_t>::iterator deadline_pos;  // valid iff deadline() is finite
};

// Waiting sequences. Holds no blocks. Order: a QueueOrder's (queue_order.h): effective priority (larger
// first), then arrival; within one base priority the deque order (arrival, preempted sequences in front) is
// kept, except that the sequences a rule defers at `now` come after the rest of their priority, in the same
// order among themselves. Also counts waiting sequences per reserved lane.
class WaitingQueue {
 public:
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  // By arrival within its priority; ties keep the order of Add.
  void PushByArrival(Sequence* seq);
  // Ahead of everything of its priority (a preempted sequence resumes first).
  void PushFront(Sequence* seq);
  bool Remove(const Sequence* seq);
  int32_t num_waiting_in_lane(int32_t lane_index) const {
    return lane_index >= 0 && static_cast<size_t>(lane_index) < lane_counts_.size()
               ? lane_counts_[static_cast<size_t>(lane_index)] : 0;
  }
  // Visits waiting sequences in `order` at `now` until `fn(Sequence&)` returns false.
  // `fn` must not change the queue. (A template, not a std::function: the planner's
  // closure would be allocated every step.)
  template <typename Fn>
  void VisitInOrder(TimePoint now, const QueueOrder& order, Fn&& fn) const;
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const auto& [priority, queue] : by_priority_) {
      for (Sequence* seq : queue) fn(seq);
    }
  }

 private:
  void CountLane(const Sequence* seq, int32_t delta);

  // VisitInOrder's position in each priority's deque.
  struct Cursor {
    const std::deque<Sequence*>* queue;
    size_t next;
    bool deferred_pass;  // visiting the deferred ones, after the rest
  };
  // The merge of the deques by their heads' effective priority; the visited one advances.
  Sequence* NextInOrder(TimePoint now, const QueueOrder& order) const;
  // Moves c.next to the next sequence of c's pass (the deferred pass after the first); false at the end.
  static bool SeekHead(Cursor& c, TimePoint now, const QueueOrder& order);

  std::map<int32_t, std::deque<Sequence*>, std::greater<>> by_priority_;
  std::vector<int32_t> lane_counts_;
  size_t size_ = 0;
  mutable std::vector<Cursor> cursors_;  // VisitInOrder's, kept for its capacity
};

template <typename Fn>
void WaitingQueue::VisitInOrder(TimePoint now, const QueueOrder& order, Fn&& fn) const {
  cursors_.clear();
  for (const auto& [priority, queue] : by_priority_) cursors_.push_back(Cursor{&queue, 0, false});
  while (Sequence* seq = NextInOrder(now, order)) {
    if (!fn(*seq)) return;
  }
}

}  // namespace ferry::scheduler
