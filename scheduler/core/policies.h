// The planning policies, as functions over the scheduler state. Plan() runs
// them in order: ScheduleRunning (with preemption), then AdmitWaiting. Later
// policies (priority aging, lane reservations, prefix caching, deadlines,
// adaptive caps) replace ServesBefore, the chunk sizing or the admission test
// here without touching the facade.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "scheduler/core/block_manager.h"
#include "scheduler/core/sequence.h"
#include "scheduler/core/types.h"

namespace ferry::scheduler {

// Everything the scheduler knows. One owner: the SchedulerCore facade.
struct SchedulerState {
  explicit SchedulerState(const SchedulerConfig& cfg)
      : config(cfg), blocks(cfg.num_kv_blocks, cfg.block_size) {}

  SchedulerConfig config;
  BlockManager blocks;  // declared before `sequences`: outlives every lease
  std::unordered_map<uint64_t, std::unique_ptr<Sequence>> sequences;  // every live one
  WaitingQueue waiting;              // holds no blocks
  std::vector<Sequence*> running;    // admitted, hold blocks; in admission order
  std::vector<uint64_t> pending_finished_ids;  // for the next plan's finished_ids
  uint64_t num_admissions = 0;
  uint64_t num_preemptions = 0;
};

// Service order among running sequences: higher priority first, then the one
// started earlier. The preemption victim is the last in this order (lowest
// priority, most recently started).
bool ServesBefore(const Sequence& a, const Sequence& b);

// How many of `want` tokens the sequence can compute with its blocks plus the
// free pool.
int32_t TokensThatFit(const Sequence& seq, int32_t want);

// Builds one StepPlan, tracking what is left of the step's budget.
class StepPlanner {
 public:
  StepPlanner(SchedulerState& state, const Budget& budget, StepPlan& plan);

  // Running sequences in service order: decodes get one token each, partial
  // prefills a chunk of what the decodes leave. Out of blocks, the least
  // deserving running sequence not yet served this step is preempted.
  void ScheduleRunning();
  // Waiting sequences by priority then arrival, while seats, tokens and blocks
  // last. Strict order: stops at the first that does not fit.
  void AdmitWaiting();

 private:
  // Covers `want` tokens (a prefill may take fewer), preempting from the tail
  // of order[0, *end) as needed. Returns the tokens granted; 0 if none.
  int32_t GrowOrPreempt(Sequence& seq, int32_t want, const std::vector<Sequence*>& order,
                        size_t self, size_t* end, std::vector<BlockId>* new_blocks);
  void Schedule(Sequence& seq, int32_t num_tokens, std::vector<BlockId> new_blocks);
  void Preempt(Sequence& seq);

  SchedulerState& state_;
  Budget budget_;
  StepPlan& plan_;
  int32_t tokens_left_;
  int32_t num_scheduled_ = 0;
  bool did_preempt_ = false;
};

}  // namespace ferry::scheduler
