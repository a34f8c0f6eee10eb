// The planning policies, as functions over the scheduler state. Plan() runs
// them in order: ScheduleRunning (with preemption), then AdmitWaiting. Rules in
// README.md.
#pragma once

#include <cstdint>
#include <map>
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
      : config(cfg), order(cfg), blocks(cfg.num_kv_blocks, cfg.block_size) {}

  SchedulerConfig config;
  QueueOrder order;     // the waiting queue's rules (and running sequences' effective priority)
  BlockManager blocks;  // declared before `sequences`: outlives every lease
  std::unordered_map<uint64_t, std::unique_ptr<Sequence>> sequences;  // every live one
  WaitingQueue waiting;              // holds no blocks
  std::vector<Sequence*> running;    // admitted, hold blocks; in admission order
  std::vector<uint64_t> pending_finished_ids;  // for the next plan's finished_ids
  std::multimap<TimePoint, uint64_t> deadlines;  // live sequences with a finite deadline
  uint64_t num_admissions = 0;
  uint64_t num_preemptions = 0;
  uint64_t num_priority_preemptions = 0;  // of those, to admit a higher-priority request
  uint64_t num_prefix_cache_queries = 0;  // full blocks looked up at admission
  uint64_t num_prefix_cache_hits = 0;     // of those, blocks reused from the cache
  uint64_t num_retired = 0;
  std::vector<KvLease> debug_leaked;      // config.debug_leak_kv_every's leases (after `blocks`)
  std::vector<std::vector<char>> debug_leaked_bytes;  // config.debug_leak_bytes_per_request's
};

// Service order among running sequences: higher effective priority first, then
// the one started earlier. The preemption victim is the last in this order
// that its lane's reservation does not protect.
bool ServesBefore(const Sequence& a, const Sequence& b);

// Whole blocks a preemption by recompute throws away: the computed tokens not
// in blocks published to the prefix cache (a resume finds those unless
// evicted), in blocks, rounded down. With prefix caching this is 0 for almost
// every sequence.
int32_t RecomputeCost(const Sequence& seq, int32_t block_size);

// How many of `want` tokens the sequence can compute with its blocks plus the
// free pool.
int32_t TokensThatFit(const Sequence& seq, int32_t want);

// Publishes the sequence's full blocks before position `computed` (the KV a
// committed step wrote) not yet in the prefix cache.
void PublishComputedBlocks(BlockManager& blocks, Sequence& seq, int32_t computed);

// Per reserved lane: its reservation for this step and what its running
// sequences use. Empty when no lane is reserved.
struct LaneUsage {
  std::vector<int32_t> reserved_seats, reserved_blocks;
  std::vector<int32_t> num_seats, num_blocks;  // of running sequences
  std::vector<int32_t> num_admitted;           // this step, still in the waiting queue
  bool is_active() const { return !reserved_seats.empty(); }
};

// The planner's working storage, kept by the core from step to step for its capacity: a steady
// decode step allocates nothing (#26).
struct PlanBuffers {
  std::vector<Sequence*> order;       // ScheduleRunning's service order
  std::vector<Sequence*> admitted;    // AdmitPass
  std::vector<Sequence*> candidates;  // PreemptFor
  std::vector<const std::string*> adapters;  // AdmitPass: the distinct LoRA adapters running
  LaneUsage lanes;
  // Emptied new_block_ids vectors of reused plans, handed to the sequences scheduled next. A
  // plan's vectors come only from here (made when none is left), so no more circulate than the
  // plans in use hold at once.
  std::vector<std::vector<BlockId>> spare_block_ids;
  size_t num_block_id_vectors = 0;  // made so far: room for all of them is kept in spare_block_ids

  std::vector<BlockId> TakeBlockIds() {
    if (spare_block_ids.empty()) {
      // A new vector: the pool may one day hold it too, so it grows now, never when one returns
      // (a batch that shrinks after its peak returned more than the pool ever held: #53).
      if (spare_block_ids.capacity() < ++num_block_id_vectors) spare_block_ids.reserve(2 * num_block_id_vectors);
      return {};
    }
    std::vector<BlockId> ids = std::move(spare_block_ids.back());
    spare_block_ids.pop_back();
    return ids;
  }
};

// Builds one StepPlan, tracking what is left of the step's budget. `plan` comes empty.
class StepPlanner {
 public:
  StepPlanner(SchedulerState& state, PlanBuffers& buffers, const Budget& budget, StepPlan& plan, TimePoint now);

  // Running sequences in service order: decodes get one token each, partial
  // prefills a chunk of what the decodes leave. Out of blocks, the least
  // deserving unprotected running sequence not yet served this step is preempted.
  void ScheduleRunning();
  // Waiting sequences in queue order (effective priority, then arrival), while
  // seats, tokens and blocks last. Stops at the first that does not fit; skips
  // one that only another lane's reservation keeps out. Priority preemption:
  // the first that lacks a seat or blocks preempts running sequences of
  // strictly lower effective priority, when that makes it fit.
  void AdmitWaiting();

 private:
  // kStepFull: this step cannot carry the sequence's tokens (max_step_sent_tokens); the next one
  // will, and nothing is preempted for it.
  enum class Admission { kAdmitted, kSkipped, kStop, kStepFull };
  // One pass over the waiting queue; returns the sequence that stopped it for
  // lack of a seat or blocks (nullptr if none).
  Sequence* AdmitPass();
  Admission TryAdmit(Sequence& seq);
  // SchedulerConfig::max_loras: buffers_.adapters holds the distinct adapters running (NoteAdapter
  // adds a sequence's), and AdapterFits says whether `seq`'s fits beside them.
  void NoteAdapter(const Sequence& seq);
  bool AdapterFits(const Sequence& seq) const;
  // Preempts running sequences of strictly lower effective priority, not
  // protected by a reservation, worst first (lowest priority, then fewest
  // blocks to recompute, then latest started) until `seq` has a seat and
  // blocks for its first chunk. Preempts nothing and returns false if they
  // cannot.
  bool PreemptFor(const Sequence& seq);
  // Removes a sequence scheduled in this plan from it (before preempting it).
  void Unschedule(Sequence& seq);
  std::vector<BlockId> FindCachedPrefix(Sequence& seq);
  // Covers `want` tokens (a prefill may take fewer), preempting from the tail
  // of order[0, *end) as needed. Returns the tokens granted; 0 if none.
  int32_t GrowOrPreempt(Sequence& seq, int32_t want, std::vector<Sequence*>& order,
                        size_t self, size_t* end, std::vector<BlockId>* new_blocks);
  // The last of order(self, end) that `seq` may preempt; 0 if none.
  size_t FindVictim(const Sequence& seq, const std::vector<Sequence*>& order, size_t self,
                    size_t end) const;
  bool IsProtected(const Sequence& victim, const Sequence& by) const;
  // Unused reserved seats (or blocks) of lanes other than `lane` with waiting work.
  int32_t ReservedForOthers(int32_t lane, bool seats) const;
  // Speculative decoding: after a decode's token is covered, extends its blocks over up to its
  // num_speculative_tokens draft slots, within `tokens_left`, the free blocks, max_tokens and
  // max_model_len. Returns the slots granted (0: none).
  int32_t CoverLookahead(Sequence& seq, int32_t tokens_left, std::vector<BlockId>& new_blocks);
  void Schedule(Sequence& seq, int32_t num_tokens, std::vector<BlockId> new_blocks, int32_t lookahead = 0);
  void Preempt(Sequence& seq);

  SchedulerState& state_;
  PlanBuffers& buffers_;
  Budget budget_;
  StepPlan& plan_;
  TimePoint now_;
  LaneUsage& lanes_;  // buffers_.lanes
  int32_t tokens_left_;
  int64_t sent_tokens_left_;  // of config.max_step_sent_tokens, for new_sequences
  int32_t num_scheduled_ = 0;
  bool did_preempt_ = false;
  // Highest effective priority preempted this step: only waiting sequences
  // above it are admitted afterwards (the others would be undone).
  int64_t max_preempted_priority_ = 0;
};

}  // namespace ferry::scheduler
