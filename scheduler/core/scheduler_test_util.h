// Test fixtures for the scheduler core: request/config builders, a fake model
// whose next token depends only on the sequence's tokens, a fake worker that
// executes plans strictly by the protocol (keeping a simulated KV pool so a
// block shared by mistake corrupts the output), and a harness that drives
// Plan -> Execute -> Commit and records every request's outcome.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "scheduler/core/scheduler_core.h"

namespace ferry::scheduler::testing {

constexpr int32_t kEosToken = 1;
// A prompt starting with kEosAfterBase + k makes the model emit eos as its
// (k+1)-th generated token; any other first token never yields eos.
constexpr int32_t kEosAfterBase = 1000;

inline SchedulerConfig MakeConfig(int32_t num_kv_blocks = 256, int32_t block_size = 4,
                                  int32_t max_model_len = 256) {
  SchedulerConfig cfg;
  cfg.max_num_seqs = 256;
  cfg.max_num_batched_tokens = 8192;
  cfg.max_model_len = max_model_len;
  cfg.block_size = block_size;
  cfg.num_kv_blocks = num_kv_blocks;
  return cfg;
}

inline TimePoint Ms(int64_t ms) { return TimePoint(std::chrono::milliseconds(ms)); }

// The plan's entry for `id`; nullptr when it is not scheduled.
inline const ScheduledSequence* Find(const StepPlan& plan, uint64_t id) {
  auto it = std::find_if(plan.scheduled.begin(), plan.scheduled.end(),
                         [&](const ScheduledSequence& s) { return s.seq_id == id; });
  return it == plan.scheduled.end() ? nullptr : &*it;
}

inline Budget MakeBudget(int32_t max_num_seqs = 256, int32_t max_num_batched_tokens = 8192) {
  return Budget{.max_num_seqs = max_num_seqs, .max_num_batched_tokens = max_num_batched_tokens};
}

struct RequestOptions {
  int32_t prompt_len = 8;
  int32_t max_tokens = 16;
  int32_t eos_after = -1;  // generated tokens before the eos; -1: never
  int32_t priority = 0;
  int64_t arrival_ms = 0;
  std::vector<int32_t> stop_token_ids = {};
  bool ignore_eos = false;
  std::string lane = "";
  int64_t deadline_ms = -1;          // -1: none
  int64_t queue_deadline_ms = -1;    // -1: none
  int64_t first_token_target_ms = -1;  // -1: none
  std::vector<int32_t> prefix = {};  // shared tokens placed before the prompt_len own ones
};

inline RequestSpec MakeRequest(uint64_t seq_id, const RequestOptions& o = {}) {
  RequestSpec r;
  r.seq_id = seq_id;
  r.request_id = "req-" + std::to_string(seq_id);
  for (int32_t i = 0; i < o.prompt_len; ++i) {
    r.prompt.push_back(10 + static_cast<int32_t>((seq_id * 31 + static_cast<uint64_t>(i) * 7) % 900));
  }
  r.prompt.insert(r.prompt.begin(), o.prefix.begin(), o.prefix.end());
  if (o.eos_after >= 0) r.prompt[0] = kEosAfterBase + o.eos_after;
  r.max_tokens = o.max_tokens;
  r.sampling.encoded = "sampling of " + std::to_string(seq_id);  // carried, never read
  r.eos_token_ids = {kEosToken};
  r.stop_token_ids = o.stop_token_ids;
  r.ignore_eos = o.ignore_eos;
  r.priority = o.priority;
  r.arrival = TimePoint(std::chrono::milliseconds(o.arrival_ms));
  r.lane = o.lane;
  if (o.deadline_ms >= 0) r.deadline = TimePoint(std::chrono::milliseconds(o.deadline_ms));
  if (o.queue_deadline_ms >= 0) r.queue_deadline = TimePoint(std::chrono::milliseconds(o.queue_deadline_ms));
  if (o.first_token_target_ms >= 0) {
    r.first_token_target = TimePoint(std::chrono::milliseconds(o.first_token_target_ms));
  }
  return r;
}

// The fake model: a function of the sequence's tokens (and how many are prompt).
inline int32_t FakeNextToken(const std::vector<int32_t>& tokens, int32_t num_prompt) {
  const int32_t num_generated = static_cast<int32_t>(tokens.size()) - num_prompt;
  if (tokens[0] >= kEosAfterBase && num_generated == tokens[0] - kEosAfterBase) return kEosToken;
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : tokens) h = (h ^ static_cast<uint64_t>(t)) * 1099511628211ull;
  return 10 + static_cast<int32_t>(h % 990);
}

struct Outcome {
  std::vector<int32_t> tokens;  // generated
  FinishKind finish = FinishKind::kNone;
  int num_ends = 0;
  int32_t num_prompt_tokens = 0;  // the final event's account
  int32_t num_generated = 0;
};

// What the request produces when it runs alone, start to finish.
inline Outcome Reference(const RequestSpec& r, int32_t max_model_len) {
  Outcome out;
  std::vector<int32_t> tokens = r.prompt;
  auto has = [](const std::vector<int32_t>& v, int32_t t) {
    return std::find(v.begin(), v.end(), t) != v.end();
  };
  while (true) {
    int32_t t = FakeNextToken(tokens, static_cast<int32_t>(r.prompt.size()));
    tokens.push_back(t);
    out.tokens.push_back(t);
    if (!r.ignore_eos && has(r.eos_token_ids, t)) out.finish = FinishKind::kEos;
    else if (has(r.stop_token_ids, t)) out.finish = FinishKind::kStopToken;
    else if (static_cast<int32_t>(out.tokens.size()) >= r.max_tokens ||
             static_cast<int32_t>(tokens.size()) >= max_model_len) out.finish = FinishKind::kLength;
    if (out.finish != FinishKind::kNone) return out;
  }
}

// Executes plans as a worker must; throws std::runtime_error on any protocol
// violation by the scheduler.
class FakeWorker {
 public:
  FakeWorker(int32_t num_blocks, int32_t block_size)
      : block_size_(block_size), kv_(static_cast<size_t>(num_blocks) * block_size, -1),
        holders_(static_cast<size_t>(num_blocks), 0) {}

  std::vector<SampledToken> Execute(const StepPlan& plan) {
    for (uint64_t id : plan.finished_ids) Forget(id, "finished");
    for (uint64_t id : plan.preempted_ids) Forget(id, "preempted");
    std::unordered_set<uint64_t> fresh;
    for (const auto& n : plan.new_sequences) {
      if (seqs_.contains(n.seq_id)) Fail(plan, n.seq_id, "sent as new but already known");
      if (n.num_generated < 0 || n.num_generated >= static_cast<int32_t>(n.token_ids.size())) {
        Fail(plan, n.seq_id, "bad num_generated");
      }
      if (n.num_cached_tokens < 0 || n.num_cached_tokens % block_size_ != 0 ||
          n.num_cached_tokens >= static_cast<int32_t>(n.token_ids.size())) {
        Fail(plan, n.seq_id, "bad num_cached_tokens " + std::to_string(n.num_cached_tokens));
      }
      seqs_[n.seq_id] = WorkerSeq{n.token_ids,
                                  static_cast<int32_t>(n.token_ids.size()) - n.num_generated,
                                  n.num_cached_tokens, {}, n.num_cached_tokens / block_size_};
      num_cached_tokens_ += n.num_cached_tokens;
      fresh.insert(n.seq_id);
    }
    std::vector<SampledToken> sampled;
    std::unordered_set<uint64_t> seen;
    for (const auto& s : plan.scheduled) {
      if (!seen.insert(s.seq_id).second) Fail(plan, s.seq_id, "scheduled twice");
      fresh.erase(s.seq_id);
      for (int32_t t : Run(plan, s)) sampled.push_back(SampledToken{s.seq_id, t});
    }
    if (!fresh.empty()) Fail(plan, *fresh.begin(), "new sequence not scheduled");
    return sampled;
  }

  bool knows(uint64_t id) const { return seqs_.contains(id); }
  int64_t num_cached_tokens() const { return num_cached_tokens_; }  // skipped via the cache
  size_t num_known() const { return seqs_.size(); }
  std::vector<BlockId> block_table(uint64_t id) const { return seqs_.at(id).blocks; }

 private:
  struct WorkerSeq {
    std::vector<int32_t> tokens;
    int32_t num_prompt = 0;
    int32_t num_computed = 0;
    std::vector<BlockId> blocks;
    int32_t num_shared_blocks = 0;  // leading blocks from the prefix cache: read-only
  };

  [[noreturn]] static void Fail(const StepPlan& plan, uint64_t id, const std::string& what) {
    throw std::runtime_error("step " + std::to_string(plan.step_id) + " seq_id " +
                             std::to_string(id) + ": " + what);
  }

  void Forget(uint64_t id, const char* why) {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) {
      throw std::runtime_error(std::string(why) + " id " + std::to_string(id) + " is unknown");
    }
    for (BlockId b : it->second.blocks) --holders_[static_cast<size_t>(b)];
    seqs_.erase(it);
  }

  // The tokens it samples: none short of the end, else one, or with lookahead the accepted
  // drafts' and one more. Drafts are the model's own next tokens for a pseudo-random number of
  // them, then a wrong one, so that some steps accept all, some none and some a few.
  std::vector<int32_t> Run(const StepPlan& plan, const ScheduledSequence& s) {
    auto it = seqs_.find(s.seq_id);
    if (it == seqs_.end()) Fail(plan, s.seq_id, "scheduled but unknown");
    WorkerSeq& w = it->second;
    const int32_t end = w.num_computed + s.num_tokens;
    if (s.num_tokens < 1 || end > static_cast<int32_t>(w.tokens.size())) {
      Fail(plan, s.seq_id, "num_tokens " + std::to_string(s.num_tokens) + " out of range");
    }
    const int32_t lookahead = s.num_lookahead_tokens;
    if (lookahead < 0 || (lookahead > 0 && end != static_cast<int32_t>(w.tokens.size()))) {
      Fail(plan, s.seq_id, "lookahead " + std::to_string(lookahead) + " on a step short of the end");
    }
    for (BlockId b : s.new_block_ids) {
      // Only the cached prefix may be a block another sequence holds.
      const bool shared = static_cast<int32_t>(w.blocks.size()) < w.num_shared_blocks;
      if (!shared && holders_.at(static_cast<size_t>(b)) != 0) Fail(plan, s.seq_id, "block in use");
      ++holders_.at(static_cast<size_t>(b));
      w.blocks.push_back(b);
    }
    if (static_cast<int32_t>(w.blocks.size()) != (end + lookahead + block_size_ - 1) / block_size_) {
      Fail(plan, s.seq_id, "block table does not cover exactly the computed positions and draft slots");
    }
    Write(plan, s.seq_id, w, w.num_computed, end);
    w.num_computed = end;
    if (end < static_cast<int32_t>(w.tokens.size())) return {};
    // Sample from what the KV pool holds, so clobbered blocks change the output.
    std::vector<int32_t> cached;
    for (int32_t p = 0; p < end; ++p) cached.push_back(Slot(w, p));
    if (cached != w.tokens) Fail(plan, s.seq_id, "KV contents were overwritten");
    std::vector<int32_t> out = {FakeNextToken(cached, w.num_prompt)};
    w.tokens.push_back(out[0]);
    if (lookahead == 0) return out;
    const auto right = static_cast<int32_t>((s.seq_id * 2654435761u + static_cast<uint64_t>(end) * 40503u) % (lookahead + 1));
    for (int32_t i = 0; i < lookahead; ++i) {
      // Draft i stands at position end + i, its K/V written there; it is right for i < `right`.
      const int32_t truth = FakeNextToken(w.tokens, w.num_prompt);
      const int32_t draft = i < right ? out.back() : -7;
      Slot(w, end + i) = draft;
      if (draft != out.back()) break;
      out.push_back(truth);
      w.tokens.push_back(truth);
      w.num_computed = end + i + 1;
    }
    // The table keeps the blocks its computed tokens need; the scheduler takes back the rest.
    const auto keep = static_cast<size_t>((w.num_computed + block_size_ - 1) / block_size_);
    while (w.blocks.size() > keep) {
      --holders_[static_cast<size_t>(w.blocks.back())];
      w.blocks.pop_back();
    }
    return out;
  }

  void Write(const StepPlan& plan, uint64_t id, const WorkerSeq& w, int32_t begin, int32_t end) {
    for (int32_t p = begin; p < end; ++p) {
      const BlockId b = w.blocks[static_cast<size_t>(p / block_size_)];
      if (holders_[static_cast<size_t>(b)] != 1) Fail(plan, id, "writes a shared block");
      Slot(w, p) = w.tokens[static_cast<size_t>(p)];
    }
  }

  int32_t& Slot(const WorkerSeq& w, int32_t pos) {
    BlockId b = w.blocks[static_cast<size_t>(pos / block_size_)];
    return kv_[static_cast<size_t>(b) * block_size_ + pos % block_size_];
  }

  int32_t block_size_;
  std::vector<int32_t> kv_;
  std::vector<int32_t> holders_;  // worker sequences whose table has the block
  int64_t num_cached_tokens_ = 0;
  std::unordered_map<uint64_t, WorkerSeq> seqs_;
};

// Drives the scheduler against the fake worker and checks every step. With
// cfg.max_steps_in_flight = 2 it runs as the async engine loop does: the
// worker executes each plan at once (a worker runs steps in order) and the
// scheduler sees its samples only after it planned the next step.
class Harness {
 public:
  explicit Harness(const SchedulerConfig& cfg)
      : core(cfg), worker(cfg.num_kv_blocks, cfg.block_size), max_model_len_(cfg.max_model_len),
        depth_(static_cast<size_t>(cfg.max_steps_in_flight)), num_kv_blocks_(cfg.num_kv_blocks),
        block_size_(cfg.block_size) {}

  void Add(const RequestSpec& r) {
    requests[r.seq_id] = r;
    outcomes[r.seq_id];
    core.Add(r);
  }
  void Cancel(uint64_t id) {
    if (core.is_live(id)) End(id, FinishKind::kCancelled);
    core.Cancel(id);
  }
  // One Plan -> Execute -> Commit cycle; checks budgets and invariants. With
  // steps in flight, the commit is of the oldest step, once the pipeline is
  // full or nothing new was planned.
  StepPlan Step(const Budget& budget = MakeBudget()) {
    StepPlan plan = core.Plan(budget, now);
    ++num_iterations;
    for (const SeqEvent& e : core.TakeEvents()) Record(e);
    if (!plan.empty()) Launch(plan, budget);
    if (!in_flight_.empty() && (in_flight_.size() >= depth_ || plan.empty())) CommitOldest();
    core.CheckInvariants();
    return plan;
  }
  // Steps until nothing is left; throws if that takes more than max_steps.
  void RunToCompletion(const Budget& budget = MakeBudget(), int max_steps = 100000) {
    for (int i = 0; core.has_work() || !in_flight_.empty(); ++i) {
      if (i >= max_steps) throw std::runtime_error("no completion after max_steps");
      Step(budget);
    }
  }
  // Commits every step still in flight (a test's last look at the state).
  void Drain() {
    while (!in_flight_.empty()) CommitOldest();
  }
  size_t num_in_flight() const { return in_flight_.size(); }
  // The worker dies: its state and the samples of the steps in flight are gone, a fresh one
  // (every KV slot unwritten) takes its place, and the core requeues everything.
  int32_t LoseWorker() {
    in_flight_.clear();
    worker = FakeWorker(num_kv_blocks_, block_size_);
    const int32_t kept = core.RequeueAll();
    core.CheckInvariants();
    return kept;
  }
  void Record(const SeqEvent& e) {
    Outcome& o = outcomes.at(e.seq_id);
    o.tokens.insert(o.tokens.end(), e.new_tokens.begin(), e.new_tokens.end());
    if (e.finish != FinishKind::kNone) {
      o.num_prompt_tokens = e.num_prompt_tokens;
      o.num_generated = e.num_generated;
      End(e.seq_id, e.finish);
    }
  }

 private:
  void Launch(const StepPlan& plan, const Budget& budget) {
    if (static_cast<int32_t>(plan.scheduled.size()) > budget.max_num_seqs) {
      throw std::runtime_error("max_num_seqs exceeded at step " + std::to_string(plan.step_id));
    }
    if (plan.num_scheduled_tokens() > budget.max_num_batched_tokens) {
      throw std::runtime_error("max_num_batched_tokens exceeded at step " +
                               std::to_string(plan.step_id));
    }
    for (const auto& n : plan.new_sequences) ++times_sent[n.seq_id];
    num_scheduled_tokens += plan.num_scheduled_tokens();
    for (uint64_t id : plan.preempted_ids) ++times_preempted[id];
    in_flight_.push_back({plan, worker.Execute(plan)});
  }
  void CommitOldest() {
    auto [plan, sampled] = std::move(in_flight_.front());
    in_flight_.pop_front();
    for (const SeqEvent& e : core.Commit(plan, sampled)) Record(e);
  }

 public:
  // Every request ended exactly once, and the ones that ran to their end match
  // the reference (cancelled/aborted ones match a prefix of it).
  void ExpectOutcomesMatchReference() const {
    for (const auto& [id, o] : outcomes) {
      SCOPED_TRACE("seq_id " + std::to_string(id));
      EXPECT_EQ(o.num_ends, 1);
      Outcome ref = Reference(requests.at(id), max_model_len_);
      if (o.finish == FinishKind::kCancelled || o.finish == FinishKind::kAborted ||
          o.finish == FinishKind::kTimeout || o.finish == FinishKind::kDeadlineExceeded ||
          o.finish == FinishKind::kQueueTimeout) {
        ASSERT_LE(o.tokens.size(), ref.tokens.size());
        EXPECT_TRUE(std::equal(o.tokens.begin(), o.tokens.end(), ref.tokens.begin()));
      } else {
        EXPECT_EQ(o.tokens, ref.tokens);
        EXPECT_EQ(o.finish, ref.finish);
      }
    }
  }

  SchedulerCore core;
  FakeWorker worker;
  std::map<uint64_t, RequestSpec> requests;
  std::map<uint64_t, Outcome> outcomes;
  std::map<uint64_t, int> times_sent;
  std::map<uint64_t, int> times_preempted;
  int num_iterations = 0;
  int64_t num_scheduled_tokens = 0;
  TimePoint now{};  // passed to Plan; tests move it

 private:
  void End(uint64_t id, FinishKind kind) {
    Outcome& o = outcomes.at(id);
    o.finish = kind;
    ++o.num_ends;
  }
  int32_t max_model_len_;
  size_t depth_;
  int32_t num_kv_blocks_;
  int32_t block_size_;
  std::deque<std::pair<StepPlan, std::vector<SampledToken>>> in_flight_;
};

}  // namespace ferry::scheduler::testing
