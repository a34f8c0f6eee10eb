#include "scheduler/core/scheduler_core.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

namespace ferry::scheduler {
namespace {

std::string Num(int64_t v) { return std::to_string(v); }

void RequirePositive(const char* field, int64_t value) {
  if (value <= 0) {
    throw std::invalid_argument(std::string(field) + " = " + Num(value) + ", must be > 0");
  }
}

bool Contains(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// Whether `token`, sampled into position `pos` of seq.tokens, ends the sequence.
FinishKind FinishAfter(const Sequence& seq, int32_t token, int32_t pos, int32_t max_model_len) {
  // Before min_tokens the worker does not sample EOS or stop tokens; should one come anyway, it
  // ends nothing (vLLM skips its stop checks until then).
  const bool may_stop = pos + 1 - seq.num_prompt_tokens() >= seq.spec.sampling.min_tokens;
  if (may_stop && !seq.spec.ignore_eos && Contains(seq.spec.eos_token_ids, token)) return FinishKind::kEos;
  if (may_stop && Contains(seq.spec.stop_token_ids, token)) return FinishKind::kStopToken;
  if (pos + 1 - seq.num_prompt_tokens() >= seq.spec.max_tokens) return FinishKind::kLength;
  if (pos + 1 >= max_model_len) return FinishKind::kLength;
  return FinishKind::kNone;
}

// The event of `seq` ending with `kind` (kNone: not ending); a final one carries its account, which
// the core forgets next. A resume's earlier tokens were given to it, with the prompt: it generated
// only the rest (what its events carried).
SeqEvent EventOf(const Sequence& seq, FinishKind kind) {
  if (kind == FinishKind::kNone) return SeqEvent{.seq_id = seq.spec.seq_id};
  const auto given = static_cast<int32_t>(seq.spec.generated.size());
  return SeqEvent{.seq_id = seq.spec.seq_id, .finish = kind, .lane = seq.spec.lane, .arrival = seq.spec.arrival,
                  .num_prompt_tokens = seq.num_prompt_tokens() + given,
                  .num_generated = seq.num_generated() - seq.num_pending - given};
}

void RequireNonNegative(const char* field, int64_t value) {
  if (value < 0) {
    throw std::invalid_argument(std::string(field) + " = " + Num(value) + ", must be >= 0");
  }
}

void ValidateLanes(const std::vector<LaneReservation>& lanes) {
  double seqs = 0, blocks = 0;
  for (size_t i = 0; i < lanes.size(); ++i) {
    const LaneReservation& r = lanes[i];
    const std::string name = "lane_reservations[" + std::to_string(i) + "]";
    if (r.lane.empty()) throw std::invalid_argument(name + ".lane is empty");
    for (size_t j = 0; j < i; ++j) {
      if (lanes[j].lane == r.lane) throw std::invalid_argument(name + ".lane '" + r.lane + "' repeats");
    }
    for (auto [field, v] : {std::pair{".min_seqs_fraction", r.min_seqs_fraction},
                            std::pair{".min_blocks_fraction", r.min_blocks_fraction}}) {
      if (!(v >= 0.0 && v <= 1.0)) {
        throw std::invalid_argument(name + field + " = " + std::to_string(v) + ", must be in [0, 1]");
      }
    }
    seqs += r.min_seqs_fraction;
    blocks += r.min_blocks_fraction;
  }
  if (seqs > 1.0 || blocks > 1.0) {
    throw std::invalid_argument("lane_reservations: fractions sum to " + std::to_string(seqs) +
                                " of seats and " + std::to_string(blocks) + " of blocks, must be <= 1");
  }
}

void ValidateLaneTtft(const SchedulerConfig& config) {
  for (size_t i = 0; i < config.lane_ttft.size(); ++i) {
    const LaneTtft& t = config.lane_ttft[i];
    const std::string name = "lane_ttft[" + Num(static_cast<int64_t>(i)) + "]";
    if (t.lane.empty()) throw std::invalid_argument(name + ".lane is empty");
    if (!(t.ttft_ms > 0) || !std::isfinite(t.ttft_ms)) {
      throw std::invalid_argument(name + " (" + t.lane + ").ttft_ms = " + std::to_string(t.ttft_ms) +
                                  ", must be > 0 and finite");
    }
    for (size_t j = 0; j < i; ++j) {
      if (config.lane_ttft[j].lane == t.lane) throw std::invalid_argument(name + ": lane " + t.lane + " appears twice");
    }
  }
  if (!(config.default_ttft_ms >= 0) || !std::isfinite(config.default_ttft_ms)) {
    throw std::invalid_argument("default_ttft_ms = " + std::to_string(config.default_ttft_ms) +
                                ", must be >= 0 and finite");
  }
}

// serve_late_last: arrival + the lane's target; max when it has none.
TimePoint FirstTokenTarget(const RequestSpec& r, const SchedulerConfig& config) {
  double ms = config.default_ttft_ms;
  for (const LaneTtft& t : config.lane_ttft) {
    if (t.lane == r.lane) ms = t.ttft_ms;
  }
  if (!config.serve_late_last || ms <= 0) return TimePoint::max();
  return r.arrival + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
}

// The last sampled token is never computed, so total - 1 positions need KV.
int64_t BlocksNeeded(int64_t total_tokens, int32_t block_size) {
  return (total_tokens - 1 + block_size - 1) / block_size;
}

const SchedulerConfig& Validated(const SchedulerConfig& config) {
  RequirePositive("max_num_seqs", config.max_num_seqs);
  RequirePositive("max_num_batched_tokens", config.max_num_batched_tokens);
  RequirePositive("max_model_len", config.max_model_len);
  RequirePositive("block_size", config.block_size);
  RequirePositive("num_kv_blocks", config.num_kv_blocks);
  RequireNonNegative("aging_interval_ms", config.aging_interval_ms);
  if (config.max_steps_in_flight < 1 || config.max_steps_in_flight > 4) {
    throw std::invalid_argument("max_steps_in_flight = " + Num(config.max_steps_in_flight) +
                                ", must be in [1, 4]");
  }
  ValidateLanes(config.lane_reservations);
  ValidateLaneTtft(config);
  RequirePositive("max_step_sent_tokens", config.max_step_sent_tokens);
  RequireNonNegative("debug_leak_kv_every", config.debug_leak_kv_every);
  if (config.debug_leak_bytes_per_request < 0 || config.debug_leak_bytes_per_request > (int64_t{1} << 30)) {
    throw std::invalid_argument("debug_leak_bytes_per_request = " + Num(config.debug_leak_bytes_per_request) +
                                ", must be in [0, 2^30]");
  }
  if (config.max_model_len > config.max_step_sent_tokens) {
    throw std::invalid_argument("max_model_len = " + Num(config.max_model_len) +
                                " exceeds max_step_sent_tokens = " + Num(config.max_step_sent_tokens) +
                                ": a sequence could not be sent to the worker in one step");
  }
  return config;
}

}  // namespace

LaneTtft ParseLaneTtft(const std::string& spec) {
  const size_t eq = spec.find('=');
  size_t end = 0;
  double ms = 0;
  try {
    if (eq != std::string::npos) ms = std::stod(spec.substr(eq + 1), &end);
  } catch (const std::exception&) {
    end = 0;
  }
  if (eq == std::string::npos || eq == 0 || end == 0 || eq + 1 + end != spec.size() || !(ms > 0) ||
      !std::isfinite(ms)) {
    throw std::invalid_argument("--lane-ttft-ms " + spec + ": want LANE=MS with MS > 0");
  }
  return {spec.substr(0, eq), ms};
}

SchedulerCore::SchedulerCore(const SchedulerConfig& config) : state_(Validated(config)) {
  // The block id vectors a steady decode needs, made now: one per sequence of every plan that can be
  // alive at once (in flight, being planned, kept for reuse), room for a decode's block and a draft's.
  // Made on demand, a step in which more sequences than ever before cross a block boundary at once
  // (the pipeline's timing shifts under load) would allocate in a steady state (#53).
  const auto count = static_cast<size_t>(config.max_num_seqs) * static_cast<size_t>(config.max_steps_in_flight + 2);
  plan_buffers_.spare_block_ids.resize(count);
  for (std::vector<BlockId>& ids : plan_buffers_.spare_block_ids) ids.reserve(2);
  plan_buffers_.num_block_id_vectors = count;
}

void SchedulerCore::Add(RequestSpec request) {
  const auto& cfg = state_.config;
  const std::string id = "seq_id " + std::to_string(request.seq_id) + ": ";
  if (is_live(request.seq_id)) throw std::invalid_argument(id + "seq_id is already live");
  if (const std::string error = RequestError(request, cfg); !error.empty()) throw std::invalid_argument(id + error);
  const int64_t total = static_cast<int64_t>(request.prompt.size()) + request.max_tokens;
  const int64_t blocks_needed = BlocksNeeded(total, cfg.block_size);
  const uint64_t seq_id = request.seq_id;
  if (request.first_token_target == TimePoint::max()) request.first_token_target = FirstTokenTarget(request, cfg);
  auto seq = std::make_unique<Sequence>(std::move(request), state_.blocks.NewLease());
  // Room for all its tokens and blocks now, so that its steps do not grow them.
  seq->tokens.reserve(static_cast<size_t>(total));
  seq->lease.Reserve(static_cast<int32_t>(blocks_needed));
  if (cfg.enable_prefix_caching) seq->block_hashes.reserve(static_cast<size_t>(total / cfg.block_size));
  const auto& lanes = cfg.lane_reservations;
  for (size_t i = 0; i < lanes.size(); ++i) {
    if (lanes[i].lane == seq->spec.lane) seq->lane_index = static_cast<int32_t>(i);
  }
  if (seq->deadline() != TimePoint::max()) seq->deadline_pos = state_.deadlines.emplace(seq->deadline(), seq_id);
  state_.waiting.PushByArrival(seq.get());
  state_.sequences.emplace(seq_id, std::move(seq));
}

std::string SchedulerCore::RequestError(const RequestSpec& request, const SchedulerConfig& config) {
  if (request.prompt.empty()) return "prompt is empty";
  if (auto bad = std::find_if(request.prompt.begin(), request.prompt.end(), [](int32_t t) { return t < 0; });
      bad != request.prompt.end()) {
    return "prompt[" + Num(bad - request.prompt.begin()) + "] = " + Num(*bad) + ", must be >= 0";
  }
  if (request.max_tokens < 1) return "max_tokens = " + Num(request.max_tokens) + ", must be >= 1";
  if (auto bad = std::find_if(request.generated.begin(), request.generated.end(), [](int32_t t) { return t < 0; });
      bad != request.generated.end()) {
    return "generated_token_ids[" + Num(bad - request.generated.begin()) + "] = " + Num(*bad) + ", must be >= 0";
  }
  if (static_cast<int64_t>(request.generated.size()) >= request.max_tokens) {
    return "generated_token_ids (count) = " + Num(static_cast<int64_t>(request.generated.size())) +
           ", must be < max_tokens = " + Num(request.max_tokens);
  }
  const int64_t total = static_cast<int64_t>(request.prompt.size()) + request.max_tokens;
  if (total > config.max_model_len) {
    return "prompt+max_tokens = " + Num(total) + " exceeds max_model_len = " + Num(config.max_model_len);
  }
  // A sequence that could never hold all its blocks would wait forever: refused now.
  const int64_t blocks_needed = BlocksNeeded(total, config.block_size);
  if (blocks_needed > config.num_kv_blocks) {
    return "prompt+max_tokens = " + Num(total) + " needs " + Num(blocks_needed) +
           " KV blocks, exceeds num_kv_blocks = " + Num(config.num_kv_blocks);
  }
  return "";
}

void SchedulerCore::Cancel(uint64_t seq_id) {
  Sequence* seq = Find(seq_id);
  if (seq != nullptr) Retire(*seq);
}

void SchedulerCore::Plan(const Budget& budget, TimePoint now, StepPlan& plan) {
  if (num_steps_in_flight() >= state_.config.max_steps_in_flight) {
    throw std::logic_error("Plan called with " + Num(num_steps_in_flight()) +
                           " steps awaiting Commit (max_steps_in_flight = " +
                           Num(state_.config.max_steps_in_flight) + "), oldest step " +
                           std::to_string(oldest_in_flight().step_id));
  }
  RequirePositive("budget.max_num_seqs", budget.max_num_seqs);
  RequirePositive("budget.max_num_batched_tokens", budget.max_num_batched_tokens);
  // The old plan's block id vectors go to this plan's sequences (cleared, capacity kept).
  for (ScheduledSequence& s : plan.scheduled) {
    if (s.new_block_ids.capacity() == 0) continue;
    s.new_block_ids.clear();
    plan_buffers_.spare_block_ids.push_back(std::move(s.new_block_ids));
  }
  plan.step_id = 0;
  plan.new_sequences.clear();
  plan.scheduled.clear();
  plan.preempted_ids.clear();
  // A speculative step in flight: how many tokens its sequences get is unknown until its Commit,
  // so they cannot be planned; a step without them would leave them out of every other step.
  // The next plan waits for that Commit (as with max_steps_in_flight = 1).
  if (num_in_flight_ > 0 && std::any_of(state_.running.begin(), state_.running.end(),
                                        [](const Sequence* s) { return s->is_speculating; })) {
    plan.finished_ids.clear();
    return;
  }
  ExpireDeadlines(now);  // first: their ids go into this plan's finished_ids
  plan.finished_ids.assign(state_.pending_finished_ids.begin(), state_.pending_finished_ids.end());
  state_.pending_finished_ids.clear();
  StepPlanner planner(state_, plan_buffers_, budget, plan, now);
  planner.ScheduleRunning();
  planner.AdmitWaiting();
  if (!plan.empty()) {
    plan.step_id = ++num_steps_;
    Launch(plan);
    MarkSent(plan, now);
  }
}

void SchedulerCore::MarkSent(const StepPlan& plan, TimePoint now) {
  for (const NewSequence& sent : plan.new_sequences) {
    Sequence& seq = *Find(sent.seq_id);
    if (seq.is_sent) continue;
    const TimePoint before = seq.deadline();
    seq.is_sent = true;
    if (seq.deadline() != before) {  // the queue deadline was the earlier: it no longer applies
      state_.deadlines.erase(seq.deadline_pos);
      if (seq.deadline() != TimePoint::max()) {
        seq.deadline_pos = state_.deadlines.emplace(seq.deadline(), sent.seq_id);
      }
    }
    events_.push_back(
        SeqEvent{.seq_id = sent.seq_id, .first_scheduled = now, .num_cached_tokens = sent.num_cached_tokens});
  }
}

void SchedulerCore::Launch(const StepPlan& plan) {
  InFlightStep& step = in_flight_[(in_flight_head_ + num_in_flight_) % kMaxStepsInFlight];
  step.step_id = plan.step_id;
  step.entries.clear();
  for (const ScheduledSequence& entry : plan.scheduled) {
    Sequence& seq = *Find(entry.seq_id);
    seq.num_computed += entry.num_tokens;
    // Reaching the end of the known tokens, the worker samples one: the next
    // plan already counts it (a decode of it), before its id is known.
    const bool samples = seq.num_computed == seq.num_tokens();
    if (samples) {
      seq.tokens.push_back(kPendingToken);
      ++seq.num_pending;
    }
    // With draft slots it may sample more: the sequence waits for this step's Commit.
    seq.num_lookahead = entry.num_lookahead_tokens;
    seq.is_speculating = entry.num_lookahead_tokens > 0;
    step.entries.push_back(
        PlannedEntry{entry.seq_id, samples, seq.num_computed, seq.start_order, entry.num_lookahead_tokens});
  }
  ++num_in_flight_;
}

void SchedulerCore::ExpireDeadlines(TimePoint now) {
  auto& deadlines = state_.deadlines;
  while (!deadlines.empty() && deadlines.begin()->first <= now) {
    Sequence& seq = *Find(deadlines.begin()->second);
    // Whichever came first. A queue timeout holds for a sequence never sent, even one admitted and
    // preempted unsent (its client has had no token).
    const bool queue_timeout =
        !seq.is_sent && seq.spec.queue_deadline <= now && seq.spec.queue_deadline < seq.spec.deadline;
    const FinishKind kind = queue_timeout       ? FinishKind::kQueueTimeout
                            : seq.has_started() ? FinishKind::kTimeout
                                                : FinishKind::kDeadlineExceeded;
    events_.push_back(EventOf(seq, kind));
    Retire(seq);  // erases the deadline entry
  }
}

void SchedulerCore::IndexSamples(const std::vector<SampledToken>& sampled) {
  sample_index_.clear();
  for (size_t i = 0; i < sampled.size(); ++i) sample_index_.emplace_back(sampled[i].seq_id, i);
  std::sort(sample_index_.begin(), sample_index_.end());
}

std::pair<size_t, int32_t> SchedulerCore::FindSample(uint64_t seq_id) const {
  const auto first = std::lower_bound(sample_index_.begin(), sample_index_.end(), std::pair{seq_id, size_t{0}});
  auto last = first;
  while (last != sample_index_.end() && last->first == seq_id) ++last;
  return {first == last ? 0 : first->second, static_cast<int32_t>(last - first)};
}

void SchedulerCore::ValidateCommit(const StepPlan& plan,
                                   const std::vector<SampledToken>& sampled) const {
  if (num_in_flight_ == 0 || plan.step_id != oldest_in_flight().step_id) {
    throw std::invalid_argument("Commit: plan step_id = " + std::to_string(plan.step_id) +
                                " is not the oldest step in flight (" +
                                (num_in_flight_ == 0 ? "none" : std::to_string(oldest_in_flight().step_id)) +
                                ")");
  }
  const auto& entries = oldest_in_flight().entries;
  size_t num_matched = 0;  // samples of scheduled sequences
  for (const PlannedEntry& entry : entries) {
    const int32_t got = FindSample(entry.seq_id).second;
    num_matched += static_cast<size_t>(got);
    if (Find(entry.seq_id) == nullptr) continue;  // ended since Plan: its sample is moot
    const int32_t most = entry.samples ? 1 + entry.lookahead : 0;
    if (got > 1) {  // several: consecutive in `sampled`, so that they read in position order
      const auto [first, count] = FindSample(entry.seq_id);
      const auto last = std::lower_bound(sample_index_.begin(), sample_index_.end(), std::pair{entry.seq_id + 1, size_t{0}});
      if ((last - 1)->second - first + 1 != static_cast<size_t>(count)) {
        throw std::invalid_argument("Commit: the samples of seq_id " + std::to_string(entry.seq_id) + " are not consecutive");
      }
    }
    if (got < (entry.samples ? 1 : 0) || got > most) {
      throw std::invalid_argument("Commit: seq_id " + std::to_string(entry.seq_id) + " has " + Num(got) +
                                  " samples, expected " + (entry.samples ? "1 to " + Num(most) : "0"));
    }
  }
  if (num_matched == sampled.size()) return;
  for (const auto& [seq_id, i] : sample_index_) {
    if (std::none_of(entries.begin(), entries.end(), [&](const PlannedEntry& e) { return e.seq_id == seq_id; })) {
      throw std::invalid_argument("Commit: sample for seq_id " + std::to_string(seq_id) +
                                  ", which was not scheduled in step " + std::to_string(plan.step_id));
    }
  }
}

void SchedulerCore::Commit(const StepPlan& plan, const std::vector<SampledToken>& sampled,
                           const std::vector<PromptLogprobs>& prompt_logprobs, std::vector<SeqEvent>& events) {
  IndexSamples(sampled);
  ValidateCommit(plan, sampled);
  // The slot stays valid below: nothing plans while this commits.
  const InFlightStep& step = oldest_in_flight();
  in_flight_head_ = (in_flight_head_ + 1) % kMaxStepsInFlight;
  --num_in_flight_;
  // Empty (allocating nothing) unless some sequence asked for prompt logprobs.
  std::unordered_map<uint64_t, std::vector<TokenLogprob>> prompt_of;
  for (const PromptLogprobs& p : prompt_logprobs) {
    if (Sequence* seq = Find(p.seq_id)) TakeNewPromptLogprobs(*seq, p, prompt_of[p.seq_id]);
  }
  events.clear();
  for (const PlannedEntry& entry : step.entries) {
    Sequence* seq = Find(entry.seq_id);
    if (seq == nullptr) continue;
    // Published only now: the step that filled these blocks is done (a later
    // step in flight may still be filling the ones after). A sequence
    // preempted since holds none of them any more.
    if (state_.config.enable_prefix_caching && seq->is_on_worker && seq->start_order == entry.start_order) {
      PublishComputedBlocks(state_.blocks, *seq, entry.computed_after);
    }
    auto prompt = prompt_of.find(entry.seq_id);
    const auto [sample, num_samples] = FindSample(entry.seq_id);
    if (num_samples == 0) {  // a prefill chunk short of the end
      if (prompt != prompt_of.end() && !prompt->second.empty()) {
        events.push_back(SeqEvent{.seq_id = entry.seq_id, .prompt_logprobs = std::move(prompt->second)});
      }
      continue;
    }
    if (entry.lookahead > 0) EndSpeculation(*seq, entry, num_samples);
    events.push_back(ApplySamples(*seq, std::span(sampled).subspan(sample, static_cast<size_t>(num_samples))));
    if (prompt != prompt_of.end()) events.back().prompt_logprobs = std::move(prompt->second);
  }
}

void SchedulerCore::TakeNewPromptLogprobs(Sequence& seq, const PromptLogprobs& from, std::vector<TokenLogprob>& to) {
  const auto count = static_cast<int32_t>(from.logprobs.size());
  const int32_t skip = std::max(0, seq.next_prompt_logprob - from.first_index);
  // A gap would mean positions the worker never scored; forward only a contiguous run.
  if (from.first_index > seq.next_prompt_logprob || skip >= count) return;
  to.insert(to.end(), from.logprobs.begin() + skip, from.logprobs.end());
  seq.next_prompt_logprob = from.first_index + count;
}

void SchedulerCore::EndSpeculation(Sequence& seq, const PlannedEntry& entry, int32_t num_samples) {
  seq.is_speculating = false;
  // Preempted since (or re-admitted): its lease is not the one the step used, and holds no slots.
  if (!seq.is_on_worker || seq.start_order != entry.start_order) return;
  // The accepted drafts' K/V is valid; the worker keeps the blocks [0, num_computed) needs, and
  // so does the lease (the rejected drafts' slots go back to the pool).
  seq.num_computed += num_samples - 1;
  seq.num_lookahead = 0;
  seq.lease.Truncate(seq.num_computed);
}

SeqEvent SchedulerCore::ApplySamples(Sequence& seq, std::span<const SampledToken> samples) {
  FinishKind finish = FinishKind::kNone;
  EventTokens tokens;
  std::vector<TokenLogprob> logprobs;
  for (size_t i = 0; i < samples.size() && finish == FinishKind::kNone; ++i) {
    const SampledToken& sample = samples[i];
    // The first fills the oldest pending slot; accepted drafts' successors follow it (a
    // speculating sequence has no later step in flight, so none is pending after it).
    int32_t pos = seq.num_tokens() - seq.num_pending;
    if (i == 0) {
      seq.tokens[static_cast<size_t>(pos)] = sample.token_id;
      --seq.num_pending;
    } else {
      pos = seq.num_tokens();
      seq.tokens.push_back(sample.token_id);
    }
    finish = FinishAfter(seq, sample.token_id, pos, state_.config.max_model_len);
    tokens.push_back(sample.token_id);
    if (sample.logprob) logprobs.push_back(*sample.logprob);
  }
  SeqEvent event = EventOf(seq, finish);
  event.new_tokens = tokens;
  event.logprobs = std::move(logprobs);
  // Ended: a step still in flight may have run it once more (on a token it could not know was
  // the last); that sample is dropped with the sequence, as are drafts accepted after it.
  if (finish != FinishKind::kNone) Retire(seq);
  return event;
}

std::vector<SeqEvent> SchedulerCore::AbortAll(FinishKind kind) {
  std::vector<uint64_t> ids;
  ids.reserve(state_.sequences.size());
  for (const auto& [id, seq] : state_.sequences) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  std::vector<SeqEvent> events;
  events.reserve(ids.size());
  for (uint64_t id : ids) {
    Sequence& seq = *Find(id);
    events.push_back(EventOf(seq, kind));
    Retire(seq);
  }
  num_in_flight_ = 0;
  return events;
}

int32_t SchedulerCore::RequeueAll() {
  const int32_t block_size = state_.config.block_size;
  for (auto& [id, seq] : state_.sequences) {  // waiting ones too: a preempted sample may be pending
    seq->tokens.resize(seq->tokens.size() - static_cast<size_t>(seq->num_pending));
    seq->num_pending = 0;
    seq->is_speculating = false;
    // Hashes of blocks that held pending tokens would be wrong once those are sampled again.
    const auto full_blocks = static_cast<size_t>(seq->num_tokens() / block_size);
    if (seq->block_hashes.size() > full_blocks) seq->block_hashes.resize(full_blocks);
  }
  // Back to front of service order, each pushed to the front: the first served resumes first.
  std::vector<Sequence*> running = std::move(state_.running);
  state_.running.clear();
  std::stable_sort(running.begin(), running.end(),
                   [](const Sequence* a, const Sequence* b) { return ServesBefore(*a, *b); });
  for (auto it = running.rbegin(); it != running.rend(); ++it) {
    Sequence& seq = **it;
    seq.ResetProgress();
    seq.is_on_worker = false;
    state_.waiting.PushFront(&seq);
  }
  state_.blocks.DropCache();
  state_.pending_finished_ids.clear();
  num_in_flight_ = 0;
  in_flight_head_ = 0;
  return static_cast<int32_t>(state_.sequences.size());
}

SchedulerCore::WaitingCount SchedulerCore::NumWaitingIn(const std::vector<std::string>& lanes,
                                                        TimePoint now) const {
  WaitingCount n;
  const QueueOrder& order = state_.order;
  if (lanes.empty() && !order.can_defer()) {
    n.on_time = num_waiting();
    return n;
  }
  state_.waiting.ForEach([&](const Sequence* s) {
    if (!lanes.empty() && std::find(lanes.begin(), lanes.end(), s->spec.lane) == lanes.end()) return;
    ++(order.Defers(*s, now) ? n.late : n.on_time);
  });
  return n;
}

void SchedulerCore::LoraAdapters(std::vector<std::string>& running, std::vector<std::string>& waiting) const {
  running.clear();
  waiting.clear();
  auto add = [](std::vector<std::string>& into, const Sequence* seq) {
    const std::string& name = seq->spec.lora_name;
    if (!name.empty() && std::find(into.begin(), into.end(), name) == into.end()) into.push_back(name);
  };
  for (const Sequence* seq : state_.running) add(running, seq);
  state_.waiting.ForEach([&](const Sequence* seq) { add(waiting, seq); });
  std::sort(running.begin(), running.end());
  std::sort(waiting.begin(), waiting.end());
}

bool SchedulerCore::has_work() const {
  return !state_.sequences.empty() || !state_.pending_finished_ids.empty();
}

std::span<const BlockId> SchedulerCore::block_ids(uint64_t seq_id) const {
  const Sequence* seq = Find(seq_id);
  return seq == nullptr ? std::span<const BlockId>() : seq->lease.block_ids();
}

Sequence* SchedulerCore::Find(uint64_t seq_id) const {
  auto it = state_.sequences.find(seq_id);
  return it == state_.sequences.end() ? nullptr : it->second.get();
}

void SchedulerCore::Retire(Sequence& seq) {
  if (!state_.waiting.Remove(&seq)) {
    auto& running = state_.running;
    auto it = std::find(running.begin(), running.end(), &seq);
    if (it == running.end()) throw std::logic_error("Retire: sequence in no queue");
    running.erase(it);
  }
  if (seq.is_on_worker) state_.pending_finished_ids.push_back(seq.spec.seq_id);
  if (seq.deadline() != TimePoint::max()) state_.deadlines.erase(seq.deadline_pos);
  const int32_t leak_every = state_.config.debug_leak_kv_every;
  ++state_.num_retired;
  if (leak_every > 0 && state_.num_retired % leak_every == 0 && seq.lease.num_blocks() > 0) {
    state_.debug_leaked.push_back(std::move(seq.lease));
  }
  if (const int64_t bytes = state_.config.debug_leak_bytes_per_request; bytes > 0) {
    state_.debug_leaked_bytes.emplace_back(static_cast<size_t>(bytes), '\1');  // written: resident
  }
  state_.sequences.erase(seq.spec.seq_id);  // the lease returns its blocks here
}

void SchedulerCore::CheckSequence(const Sequence& seq) const {
  auto fail = [&](const std::string& what) {
    throw std::logic_error("invariant: seq_id " + std::to_string(seq.spec.seq_id) + " " + what);
  };
  const BlockManager& blocks = state_.blocks;
  const auto table = seq.lease.block_ids();
  if (seq.lease.num_blocks() != blocks.BlocksFor(seq.num_computed + seq.num_lookahead)) {
    fail("holds " + Num(seq.lease.num_blocks()) + " blocks for " + Num(seq.num_computed) + " computed tokens and " +
         Num(seq.num_lookahead) + " draft slots");
  }
  if (seq.num_lookahead > 0 && !seq.is_speculating) fail("holds draft slots without a speculative step in flight");
  // Pending tokens: the last num_pending (at most one per step in flight),
  // and the token before them is known.
  const auto tail = seq.tokens.end() - seq.num_pending;
  if (seq.num_pending > num_steps_in_flight() || seq.num_pending >= seq.num_tokens() ||
      !std::all_of(tail, seq.tokens.end(), [](int32_t t) { return t == kPendingToken; }) ||
      *(tail - 1) == kPendingToken) {
    fail("has " + Num(seq.num_pending) + " pending tokens, not exactly its last ones, with " +
         Num(num_steps_in_flight()) + " steps in flight");
  }
  if (seq.num_published_blocks > seq.lease.num_blocks()) fail("published past its table");
  // A cached block in its table is one of its full, computed blocks.
  const int32_t bs = blocks.block_size();
  for (size_t i = 0; i < table.size(); ++i) {
    if (!blocks.is_cached(table[i])) continue;
    if (static_cast<int32_t>(i + 1) * bs > seq.num_computed) {
      fail("holds cached block " + Num(table[i]) + " at an uncomputed position");
    }
    const auto mine = std::span<const int32_t>(seq.tokens).subspan(i * bs, static_cast<size_t>(bs));
    const auto cached = blocks.cached_tokens(table[i]);
    if (!std::equal(mine.begin(), mine.end(), cached.begin(), cached.end())) {
      fail("holds cached block " + Num(table[i]) + " of other tokens at block " + Num(int64_t(i)));
    }
    if (i < seq.block_hashes.size() && seq.block_hashes[i] != blocks.cached_hash(table[i])) {
      fail("holds cached block " + Num(table[i]) + " under another chained hash");
    }
  }
  const bool has_deadline = seq.deadline() != TimePoint::max();
  if (has_deadline && (seq.deadline_pos->first != seq.deadline() || seq.deadline_pos->second != seq.spec.seq_id)) {
    fail("deadline entry is wrong");
  }
}

void SchedulerCore::CheckInvariants() const {
  auto fail = [](const std::string& what) { throw std::logic_error("invariant: " + what); };
  // A sequence is in exactly one of waiting/running; waiting ones hold nothing.
  std::unordered_map<const Sequence*, int> places;
  state_.waiting.ForEach([&](const Sequence* s) {
    ++places[s];
    if (s->lease.num_blocks() != 0 || s->num_computed != 0 || s->is_on_worker) {
      fail("waiting seq_id " + std::to_string(s->spec.seq_id) + " holds blocks or worker state");
    }
  });
  for (const Sequence* s : state_.running) ++places[s];
  if (places.size() != state_.sequences.size()) fail("queues and live sequences differ");
  // Every block is free, or held with ref count = number of leases holding it,
  // or cached with ref count 0.
  const BlockManager& blocks = state_.blocks;
  std::vector<int32_t> owners(static_cast<size_t>(blocks.num_total_blocks()), 0);
  size_t num_deadlines = 0;
  for (const auto& [id, seq] : state_.sequences) {
    if (places[seq.get()] != 1) fail("seq_id " + std::to_string(id) + " is queued twice or not");
    for (BlockId b : seq->lease.block_ids()) ++owners.at(static_cast<size_t>(b));
    CheckSequence(*seq);
    if (seq->deadline() != TimePoint::max()) ++num_deadlines;
  }
  for (const KvLease& leaked : state_.debug_leaked) {
    for (BlockId b : leaked.block_ids()) ++owners.at(static_cast<size_t>(b));
  }
  if (num_deadlines != state_.deadlines.size()) fail("deadline index and sequences differ");
  for (BlockId b = 0; b < blocks.num_total_blocks(); ++b) {
    const int32_t n = owners[static_cast<size_t>(b)];
    if (blocks.ref_count(b) != n) {
      fail("block " + Num(b) + " has ref_count " + Num(blocks.ref_count(b)) + " and " + Num(n) +
           " owners");
    }
    if (n > 1 && !blocks.is_cached(b)) fail("block " + Num(b) + " is shared but not cached");
  }
  blocks.CheckConsistency();  // unheld blocks are on the free or LRU list, the map is exact
}

}  // namespace ferry::scheduler
