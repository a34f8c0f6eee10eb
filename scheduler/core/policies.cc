#include "scheduler/core/policies.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

namespace ferry::scheduler {
namespace {

size_t Lane(const Sequence& seq) { return static_cast<size_t>(seq.lane_index); }

// Fills `usage` (reused: its vectors keep their capacity).
void CountLaneUsage(const SchedulerState& state, const Budget& budget, LaneUsage& usage) {
  const auto& reservations = state.config.lane_reservations;
  const size_t n = reservations.size();
  usage.reserved_seats.clear();
  usage.reserved_blocks.clear();
  for (const LaneReservation& r : reservations) {
    usage.reserved_seats.push_back(static_cast<int32_t>(std::floor(r.min_seqs_fraction * budget.max_num_seqs)));
    usage.reserved_blocks.push_back(
        static_cast<int32_t>(std::floor(r.min_blocks_fraction * state.config.num_kv_blocks)));
  }
  usage.num_seats.assign(n, 0);
  usage.num_blocks.assign(n, 0);
  usage.num_admitted.assign(n, 0);
  if (n == 0) return;
  for (const Sequence* seq : state.running) {
    if (seq->lane_index < 0) continue;
    ++usage.num_seats[Lane(*seq)];
    usage.num_blocks[Lane(*seq)] += seq->lease.num_blocks();
  }
}

}  // namespace

bool ServesBefore(const Sequence& a, const Sequence& b) {
  if (a.effective_priority != b.effective_priority) return a.effective_priority > b.effective_priority;
  return a.start_order < b.start_order;
}

int32_t RecomputeCost(const Sequence& seq, int32_t block_size) {
  return std::max(0, seq.num_computed - seq.num_published_blocks * block_size) / block_size;
}

int32_t TokensThatFit(const Sequence& seq, int32_t want) {
  return std::max(0, std::min(want, seq.lease.MaxCoverableTokens() - seq.num_computed));
}

void PublishComputedBlocks(BlockManager& blocks, Sequence& seq, int32_t computed) {
  const int32_t bs = blocks.block_size();
  const int32_t num_full = std::min(computed, seq.num_computed) / bs;
  if (seq.is_publishing_stopped || num_full <= seq.num_published_blocks) return;
  const auto hashes = seq.BlockHashes(num_full, bs);
  const auto table = seq.lease.block_ids();
  const std::span<const int32_t> tokens(seq.tokens);
  for (int32_t i = seq.num_published_blocks; i < num_full; ++i) {
    const auto at = static_cast<size_t>(i);
    const BlockId canonical = blocks.Publish(table[at], hashes[at], tokens.subspan(at * bs, bs),
                                             seq.last_published);
    if (canonical == kNoBlock) {  // a held block of other content has this hash
      seq.is_publishing_stopped = true;
      return;
    }
    seq.last_published = canonical;
    seq.num_published_blocks = i + 1;
  }
}

StepPlanner::StepPlanner(SchedulerState& state, PlanBuffers& buffers, const Budget& budget, StepPlan& plan,
                         TimePoint now)
    : state_(state), buffers_(buffers), budget_(budget), plan_(plan), now_(now), lanes_(buffers.lanes),
      tokens_left_(budget.max_num_batched_tokens), sent_tokens_left_(state.config.max_step_sent_tokens) {
  CountLaneUsage(state, budget, lanes_);
}

void StepPlanner::ScheduleRunning() {
  for (Sequence* seq : state_.running) {
    seq->effective_priority = state_.order.EffectivePriority(*seq, now_);
  }
  // A sequence whose pending tokens end it by length waits for the commit
  // that retires it (async scheduling; never the case with one step in flight).
  std::vector<Sequence*>& order = buffers_.order;
  order.clear();
  // Likewise one whose speculative step is in flight: how many tokens it brings is not known.
  for (Sequence* seq : state_.running) {
    if (!seq->is_finishing(state_.config.max_model_len) && !seq->is_speculating) order.push_back(seq);
  }
  // ServesBefore is a total order (start_order is unique), so std::sort gives the one order
  // without std::stable_sort's temporary buffer, allocated per call.
  std::sort(order.begin(), order.end(), [](const Sequence* a, const Sequence* b) { return ServesBefore(*a, *b); });
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
    if (!seq.is_on_worker && seq.num_tokens() > sent_tokens_left_) continue;  // sent whole: the next step
    std::vector<BlockId> new_blocks = buffers_.TakeBlockIds();
    int32_t granted = GrowOrPreempt(seq, want, order, i, &end, &new_blocks);
    if (granted > 0) {
      const int32_t lookahead = decode ? CoverLookahead(seq, tokens_left_ - granted - decodes_reserved, new_blocks) : 0;
      Schedule(seq, granted, std::move(new_blocks), lookahead);
    } else if (new_blocks.capacity() > 0) {
      buffers_.spare_block_ids.push_back(std::move(new_blocks));
    }
  }
}

int32_t StepPlanner::GrowOrPreempt(Sequence& seq, int32_t want, std::vector<Sequence*>& order,
                                   size_t self, size_t* end, std::vector<BlockId>* new_blocks) {
  const bool decode = seq.is_decode();
  while (true) {
    int32_t fit = TokensThatFit(seq, want);
    if (fit == want || (fit > 0 && !decode)) {
      if (!seq.lease.Cover(seq.num_computed + fit, new_blocks)) {
        throw std::logic_error("GrowOrPreempt: Cover failed after fit check");
      }
      return fit;
    }
    if (size_t victim = FindVictim(seq, order, self, *end); victim != 0) {
      Preempt(*order[victim]);
      order.erase(order.begin() + static_cast<ptrdiff_t>(victim));
      --*end;
      continue;
    }
    // Nobody it may preempt is left. A decode gives up its blocks (recompute
    // later); a partial prefill keeps its progress and waits a step.
    if (decode) Preempt(seq);  // stays in `order` before the loop's cursor: never a victim
    return 0;
  }
}

size_t StepPlanner::FindVictim(const Sequence& seq, const std::vector<Sequence*>& order,
                               size_t self, size_t end) const {
  for (size_t j = end; j-- > self + 1;) {
    if (!IsProtected(*order[j], seq)) return j;
  }
  return 0;
}

bool StepPlanner::IsProtected(const Sequence& victim, const Sequence& by) const {
  if (!lanes_.is_active() || victim.lane_index < 0 || victim.lane_index == by.lane_index) {
    return false;
  }
  const size_t l = Lane(victim);
  return lanes_.num_seats[l] <= lanes_.reserved_seats[l] ||
         lanes_.num_blocks[l] <= lanes_.reserved_blocks[l];
}

int32_t StepPlanner::ReservedForOthers(int32_t lane, bool seats) const {
  int32_t total = 0;
  for (size_t l = 0; l < lanes_.reserved_seats.size(); ++l) {
    if (static_cast<int32_t>(l) == lane) continue;
    const int32_t waiting = state_.waiting.num_waiting_in_lane(static_cast<int32_t>(l)) -
                            lanes_.num_admitted[l];
    if (waiting <= 0) continue;
    total += seats ? std::max(0, lanes_.reserved_seats[l] - lanes_.num_seats[l])
                   : std::max(0, lanes_.reserved_blocks[l] - lanes_.num_blocks[l]);
  }
  return total;
}

void StepPlanner::AdmitWaiting() {
  // Bounds the work of one step; each round admits the sequence it preempted for.
  constexpr int kMaxPriorityRounds = 8;
  for (int round = 0; round <= kMaxPriorityRounds; ++round) {
    Sequence* blocked = AdmitPass();
    if (blocked == nullptr || round == kMaxPriorityRounds || !PreemptFor(*blocked)) return;
  }
}

// Whether `seq` may run beside the adapters running (`adapters`, distinct), within max_loras.
bool StepPlanner::AdapterFits(const Sequence& seq) const {
  const std::string& name = seq.spec.lora_name;
  if (name.empty() || state_.config.max_loras <= 0) return true;
  const std::vector<const std::string*>& adapters = buffers_.adapters;
  for (const std::string* a : adapters) {
    if (*a == name) return true;
  }
  return static_cast<int32_t>(adapters.size()) < state_.config.max_loras;
}

void StepPlanner::NoteAdapter(const Sequence& seq) {
  const std::string& name = seq.spec.lora_name;
  std::vector<const std::string*>& adapters = buffers_.adapters;
  if (name.empty() || state_.config.max_loras <= 0) return;
  if (std::none_of(adapters.begin(), adapters.end(), [&](const std::string* a) { return *a == name; })) {
    adapters.push_back(&name);
  }
}

Sequence* StepPlanner::AdmitPass() {
  if (state_.waiting.empty()) return nullptr;
  const auto max_seqs = static_cast<size_t>(budget_.max_num_seqs);
  std::vector<Sequence*>& admitted = buffers_.admitted;
  admitted.clear();
  buffers_.adapters.clear();
  for (const Sequence* seq : state_.running) NoteAdapter(*seq);
  Sequence* blocked = nullptr;
  state_.waiting.VisitInOrder(now_, state_.order, [&](Sequence& seq) {
    if (tokens_left_ <= 0) return false;
    // After a preemption blocks are short: admitting a sequence not above the
    // preempted ones would only be undone (and a victim never resumes in the
    // step that preempted it).
    if (did_preempt_ && state_.order.EffectivePriority(seq, now_) <= max_preempted_priority_) return false;
    // Preempted while a step in flight samples for it: it resumes once that
    // token is known (its NewSequence carries all tokens).
    if (seq.num_pending > 0) return true;
    if (num_scheduled_ >= budget_.max_num_seqs || state_.running.size() >= max_seqs) {
      blocked = &seq;
      return false;
    }
    // Another adapter than the max_loras running: skip it, later ones of a running adapter may run.
    if (!AdapterFits(seq)) return true;
    const Admission result = TryAdmit(seq);
    if (result == Admission::kAdmitted) {
      admitted.push_back(&seq);
      NoteAdapter(seq);
    }
    if (result == Admission::kStop) blocked = &seq;
    return result != Admission::kStop && result != Admission::kStepFull;
  });
  for (Sequence* seq : admitted) state_.waiting.Remove(seq);
  return blocked;
}

bool StepPlanner::PreemptFor(const Sequence& seq) {
  // Deferred (late): it comes after every sequence not deferred, and a running one never is.
  if (state_.order.Defers(seq, now_)) return false;
  const int64_t priority = state_.order.EffectivePriority(seq, now_);
  std::vector<Sequence*>& candidates = buffers_.candidates;
  candidates.clear();
  for (Sequence* r : state_.running) {
    if (r->effective_priority < priority && !IsProtected(*r, seq)) candidates.push_back(r);
  }
  // Worst first: lowest effective priority, then the fewest whole blocks to
  // recompute, then the latest started. A seat preemption at a tight cap
  // repeats with every arrival of a higher lane; without prefix caching a
  // victim deep in a long document costs its whole context again. With it,
  // nearly every victim resumes from its cached blocks, and the latest
  // started is usually mid-prefill: its chunk's tokens go back to this step's
  // budget, for the newcomer's prompt (finer cost ranks cost TTFT there).
  const int32_t block_size = state_.blocks.block_size();
  std::stable_sort(candidates.begin(), candidates.end(), [&](const Sequence* a, const Sequence* b) {
    if (a->effective_priority == b->effective_priority) {
      const int32_t cost_a = RecomputeCost(*a, block_size), cost_b = RecomputeCost(*b, block_size);
      if (cost_a != cost_b) return cost_a < cost_b;
    }
    return ServesBefore(*b, *a);  // lower priority first, then the latest started
  });
  const BlockManager& blocks = state_.blocks;
  const auto tokens_of = [&](const Sequence& r) {
    for (const ScheduledSequence& s : plan_.scheduled) {
      if (s.seq_id == r.spec.seq_id) return s.num_tokens + s.num_lookahead_tokens;
    }
    return 0;
  };
  // What the victims chosen so far give back. Blocks another lease shares
  // stay held, so only singly held ones count.
  int32_t num_seats = static_cast<int32_t>(state_.running.size());
  int32_t num_sched = num_scheduled_, tokens = tokens_left_;
  int32_t free_blocks = blocks.num_free_blocks() - ReservedForOthers(seq.lane_index, false);
  size_t num_victims = 0;
  const auto fits = [&] {
    const int32_t chunk = std::min(seq.num_tokens(), tokens);
    return num_seats < budget_.max_num_seqs && num_sched < budget_.max_num_seqs && chunk > 0 &&
           blocks.BlocksFor(chunk) <= free_blocks;
  };
  while (!fits()) {
    if (num_victims == candidates.size()) return false;
    const Sequence& v = *candidates[num_victims++];
    --num_seats;
    if (const int32_t t = tokens_of(v); t > 0) {
      --num_sched;
      tokens += t;
    }
    for (BlockId b : v.lease.block_ids()) free_blocks += blocks.ref_count(b) == 1;
  }
  for (size_t i = 0; i < num_victims; ++i) {
    Sequence& v = *candidates[i];
    Unschedule(v);
    Preempt(v);
    ++state_.num_priority_preemptions;
  }
  return true;
}

void StepPlanner::Unschedule(Sequence& seq) {
  auto& scheduled = plan_.scheduled;
  auto it = std::find_if(scheduled.begin(), scheduled.end(),
                         [&](const ScheduledSequence& s) { return s.seq_id == seq.spec.seq_id; });
  if (it == scheduled.end()) return;
  tokens_left_ += it->num_tokens + it->num_lookahead_tokens;
  --num_scheduled_;
  scheduled.erase(it);
  // Sent first in this plan: the worker never sees it, so it is not preempted there.
  auto& fresh = plan_.new_sequences;
  auto n = std::find_if(fresh.begin(), fresh.end(),
                        [&](const NewSequence& s) { return s.seq_id == seq.spec.seq_id; });
  if (n != fresh.end()) {
    sent_tokens_left_ += static_cast<int64_t>(n->token_ids.size());
    fresh.erase(n);
    seq.is_on_worker = false;
  }
}

std::vector<BlockId> StepPlanner::FindCachedPrefix(Sequence& seq) {
  if (!state_.config.enable_prefix_caching) return {};
  // Prompt logprobs come from computing each prompt position, so none may be skipped.
  if (seq.spec.sampling.prompt_logprobs >= 0) return {};
  const int32_t bs = state_.blocks.block_size();
  // Only blocks wholly before the last token: at least one token is computed
  // (for logits), and never into a shared block.
  const int32_t max_blocks = (seq.num_tokens() - 1) / bs;
  if (max_blocks <= 0) return {};
  return state_.blocks.FindCachedPrefix(seq.tokens, seq.BlockHashes(max_blocks, bs), max_blocks);
}

StepPlanner::Admission StepPlanner::TryAdmit(Sequence& seq) {
  // Sent whole in new_sequences; the first of a step always fits (max_model_len <= the limit).
  if (!seq.is_on_worker && seq.num_tokens() > sent_tokens_left_) return Admission::kStepFull;
  BlockManager& blocks = state_.blocks;
  const int32_t bs = blocks.block_size();
  std::vector<BlockId> cached = FindCachedPrefix(seq);
  const auto num_cached = static_cast<int32_t>(cached.size()) * bs;
  // Cached blocks nobody holds count as free until this sequence takes them.
  const auto num_revived = static_cast<int32_t>(
      std::count_if(cached.begin(), cached.end(), [&](BlockId b) { return blocks.ref_count(b) == 0; }));
  int32_t num_available = blocks.num_free_blocks() - num_revived;
  int32_t fit = std::min({seq.num_tokens() - num_cached, tokens_left_, num_available * bs});
  if (fit <= 0) return Admission::kStop;
  if (lanes_.is_active()) {
    // Only another lane's reservation keeps it out: skip, later ones may fit.
    if (state_.running.size() + 1 + static_cast<size_t>(ReservedForOthers(seq.lane_index, true)) >
        static_cast<size_t>(budget_.max_num_seqs)) {
      return Admission::kSkipped;
    }
    num_available -= ReservedForOthers(seq.lane_index, false);
    fit = std::min(fit, num_available * bs);
    if (fit <= 0) return Admission::kSkipped;
  }
  if (state_.config.enable_prefix_caching) {
    state_.num_prefix_cache_queries += static_cast<uint64_t>((seq.num_tokens() - 1) / bs);
    state_.num_prefix_cache_hits += cached.size();
  }
  seq.lease.ShareCached(cached);
  seq.num_computed = num_cached;
  seq.num_published_blocks = static_cast<int32_t>(cached.size());
  seq.last_published = cached.empty() ? kNoBlock : cached.back();
  // From the spares, not `cached` itself: the plan's vectors are only ever taken from the spares
  // (or made when none is left), which bounds how many circulate between plans and spares.
  std::vector<BlockId> new_blocks = buffers_.TakeBlockIds();
  new_blocks.assign(cached.begin(), cached.end());
  if (!seq.lease.Cover(num_cached + fit, &new_blocks)) {
    throw std::logic_error("TryAdmit: Cover failed after fit check");
  }
  state_.running.push_back(&seq);
  seq.start_order = ++state_.num_admissions;
  seq.effective_priority = state_.order.EffectivePriority(seq, now_);
  if (lanes_.is_active() && seq.lane_index >= 0) {
    ++lanes_.num_seats[Lane(seq)];
    ++lanes_.num_admitted[Lane(seq)];
  }
  Schedule(seq, fit, std::move(new_blocks));
  return Admission::kAdmitted;
}

int32_t StepPlanner::CoverLookahead(Sequence& seq, int32_t tokens_left, std::vector<BlockId>& new_blocks) {
  // A step samples at most 1 + lookahead tokens: none past max_tokens or max_model_len.
  const int32_t max_len = state_.config.max_model_len;
  int32_t k = std::min({seq.spec.sampling.num_speculative_tokens, tokens_left,
                        seq.spec.max_tokens - seq.num_generated() - 1, max_len - seq.num_tokens() - 1});
  // Draft slots take free blocks only; nobody is preempted for a guess.
  k = std::min(k, TokensThatFit(seq, 1 + k) - 1);
  if (k <= 0) return 0;
  if (!seq.lease.Cover(seq.num_computed + 1 + k, &new_blocks)) {
    throw std::logic_error("CoverLookahead: Cover failed after fit check");
  }
  return k;
}

void StepPlanner::Schedule(Sequence& seq, int32_t num_tokens, std::vector<BlockId> new_blocks, int32_t lookahead) {
  if (!seq.is_on_worker) {
    sent_tokens_left_ -= seq.num_tokens();
    plan_.new_sequences.push_back(NewSequence{
        .seq_id = seq.spec.seq_id,
        .token_ids = seq.tokens,
        .num_generated = seq.num_generated(),
        .sampling = seq.spec.sampling,
        .num_cached_tokens = seq.num_computed,
        .lora_name = seq.spec.lora_name,
    });
    seq.is_on_worker = true;
  }
  if (lanes_.is_active() && seq.lane_index >= 0) {
    lanes_.num_blocks[Lane(seq)] += static_cast<int32_t>(new_blocks.size());  // shared ones too
  }
  plan_.scheduled.push_back(ScheduledSequence{.seq_id = seq.spec.seq_id,
                                              .num_tokens = num_tokens,
                                              .new_block_ids = std::move(new_blocks),
                                              .num_lookahead_tokens = lookahead});
  tokens_left_ -= num_tokens + lookahead;
  ++num_scheduled_;
}

void StepPlanner::Preempt(Sequence& seq) {
  auto& running = state_.running;
  running.erase(std::find(running.begin(), running.end(), &seq));
  if (lanes_.is_active() && seq.lane_index >= 0) {
    --lanes_.num_seats[Lane(seq)];
    lanes_.num_blocks[Lane(seq)] -= seq.lease.num_blocks();
  }
  seq.ResetProgress();
  if (seq.is_on_worker) plan_.preempted_ids.push_back(seq.spec.seq_id);
  seq.is_on_worker = false;
  ++seq.num_preemptions;
  ++state_.num_preemptions;
  state_.waiting.PushFront(&seq);
  max_preempted_priority_ = did_preempt_ ? std::max(max_preempted_priority_, seq.effective_priority)
                                         : seq.effective_priority;
  did_preempt_ = true;
}

}  // namespace ferry::scheduler
