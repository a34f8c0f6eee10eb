// Scheduler-side state of one sequence, and the waiting queue. Internal to
// scheduler/core: the facade and the policies share these; callers never see them.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <vector>

#include "scheduler/core/block_manager.h"
#include "scheduler/core/types.h"

namespace ferry::scheduler {

struct Sequence {
  Sequence(RequestSpec request, KvLease kv) : spec(std::move(request)), lease(std::move(kv)) {
    tokens = spec.prompt;
  }

  int32_t num_tokens() const { return static_cast<int32_t>(tokens.size()); }
  int32_t num_prompt_tokens() const { return static_cast<int32_t>(spec.prompt.size()); }
  int32_t num_generated() const { return num_tokens() - num_prompt_tokens(); }
  int32_t num_uncomputed() const { return num_tokens() - num_computed; }
  // One token left to compute: it runs as a decode and samples.
  bool is_decode() const { return num_uncomputed() == 1; }

  RequestSpec spec;
  std::vector<int32_t> tokens;  // prompt, then every sampled token
  // Tokens whose KV the worker holds in `lease` (advanced by Commit). Invariant
  // outside a step: lease covers exactly positions [0, num_computed).
  int32_t num_computed = 0;
  KvLease lease;
  // The worker holds state for this sequence: it was sent in new_sequences and
  // not since in preempted_ids. Decides finished_ids and re-sending.
  bool is_on_worker = false;
  uint64_t start_order = 0;  // when last admitted; larger == more recent
  int32_t num_preemptions = 0;
};

// Waiting sequences by priority (larger first), then arrival. Holds no blocks.
class WaitingQueue {
 public:
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  Sequence* front() const { return by_priority_.begin()->second.front(); }
  void PopFront();
  // By arrival within its priority; ties keep the order of Add.
  void PushByArrival(Sequence* seq);
  // Ahead of everything of its priority (a preempted sequence resumes first).
  void PushFront(Sequence* seq);
  bool Remove(const Sequence* seq);
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const auto& [priority, queue] : by_priority_) {
      for (Sequence* seq : queue) fn(seq);
    }
  }

 private:
  std::map<int32_t, std::deque<Sequence*>, std::greater<>> by_priority_;
  size_t size_ = 0;
};

}  // namespace ferry::scheduler
