#include "scheduler/core/policies.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace ferry::scheduler {

bool ServesBefore(const Sequence& a, const Sequence& b) {
  if (a.spec.priority != b.spec.priority) return a.spec.priority > b.spec.priority;
  return a.start_order < b.start_order;
}

int32_t TokensThatFit(const Sequence& seq, int32_t want) {
  return std::max(0, std::min(want, seq.lease.MaxCoverableTokens() - seq.num_computed));
}

StepPlanner::StepPlanner(SchedulerState& state, const Budget& budget, StepPlan& plan)
    : state_(state), budget_(budget), plan_(plan),
      tokens_left_(budget.max_num_batched_tokens) {}

void StepPlanner::ScheduleRunning() {
  std::vector<Sequence*> order = state_.running;
  std::stable_sort(order.begin(), order.end(),
                   [](const Sequence* a, const Sequence* b) { return ServesBefore(*a, *b); });
  // Tokens kept back for the decodes that will be served this step, so a long
  // prefill chunk never starves them.
  size_t num_seats = std::min(order.size(), static_cast<size_t>(budget_.max_num_seqs));
  int32_t decodes_reserved = static_cast<int32_t>(
      std::count_if(order.begin(), order.begin() + static_cast<ptrdiff_t>(num_seats),
                    [](const Sequence* s) { return s->is_decode(); }));
  size_t end = order.size();
  for (size_t i = 0; i < end && num_scheduled_ < budget_.max_num_seqs; ++i) {
    Sequence& seq = *order[i];
    const bool decode = seq.is_decode();
    if (decode) --decodes_reserved;
    int32_t want = decode ? 1 : std::min(seq.num_uncomputed(), tokens_left_ - decodes_reserved);
    if (want <= 0 || want > tokens_left_) continue;
    std::vector<BlockId> new_blocks;
    int32_t granted = GrowOrPreempt(seq, want, order, i, &end, &new_blocks);
    if (granted > 0) Schedule(seq, granted, std::move(new_blocks));
  }
}

int32_t StepPlanner::GrowOrPreempt(Sequence& seq, int32_t want,
                                   const std::vector<Sequence*>& order, size_t self,
                                   size_t* end, std::vector<BlockId>* new_blocks) {
  const bool decode = seq.is_decode();
  while (true) {
    int32_t fit = TokensThatFit(seq, want);
    if (fit == want || (fit > 0 && !decode)) {
      if (!seq.lease.Cover(seq.num_computed + fit, new_blocks)) {
        throw std::logic_error("GrowOrPreempt: Cover failed after fit check");
      }
      return fit;
    }
    if (*end - 1 > self) {
      Preempt(*order[--*end]);
      continue;
    }
    // Nobody less deserving is left. A decode gives up its blocks (recompute
    // later); a partial prefill keeps its progress and waits a step.
    if (decode) {
      Preempt(seq);
      --*end;
    }
    return 0;
  }
}

void StepPlanner::AdmitWaiting() {
  // After a preemption blocks are short: admitting now would only be undone.
  if (did_preempt_) return;
  const auto max_seqs = static_cast<size_t>(budget_.max_num_seqs);
  while (!state_.waiting.empty() && num_scheduled_ < budget_.max_num_seqs &&
         state_.running.size() < max_seqs && tokens_left_ > 0) {
    Sequence& seq = *state_.waiting.front();
    int32_t fit = TokensThatFit(seq, std::min(seq.num_uncomputed(), tokens_left_));
    if (fit <= 0) break;
    std::vector<BlockId> new_blocks;
    if (!seq.lease.Cover(seq.num_computed + fit, &new_blocks)) {
      throw std::logic_error("AdmitWaiting: Cover failed after fit check");
    }
    state_.waiting.PopFront();
    state_.running.push_back(&seq);
    seq.start_order = ++state_.num_admissions;
    Schedule(seq, fit, std::move(new_blocks));
  }
}

void StepPlanner::Schedule(Sequence& seq, int32_t num_tokens, std::vector<BlockId> new_blocks) {
  if (!seq.is_on_worker) {
    plan_.new_sequences.push_back(NewSequence{
        .seq_id = seq.spec.seq_id,
        .token_ids = seq.tokens,
        .num_generated = seq.num_generated(),
        .sampling = seq.spec.sampling,
    });
    seq.is_on_worker = true;
  }
  plan_.scheduled.push_back(ScheduledSequence{
      .seq_id = seq.spec.seq_id, .num_tokens = num_tokens, .new_block_ids = std::move(new_blocks)});
  tokens_left_ -= num_tokens;
  ++num_scheduled_;
}

void StepPlanner::Preempt(Sequence& seq) {
  auto& running = state_.running;
  running.erase(std::find(running.begin(), running.end(), &seq));
  seq.lease.Reset();
  seq.num_computed = 0;
  if (seq.is_on_worker) plan_.preempted_ids.push_back(seq.spec.seq_id);
  seq.is_on_worker = false;
  ++seq.num_preemptions;
  ++state_.num_preemptions;
  state_.waiting.PushFront(&seq);
  did_preempt_ = true;
}

}  // namespace ferry::scheduler
