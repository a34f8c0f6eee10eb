// Domain types of the scheduler core. No proto or gRPC here: the service
// adapter translates StepPlan <-> ferry.v1.StepRequest and SampledToken <->
// ferry.v1.SampledToken field by field.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/speculative.h"

namespace ferry::scheduler {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;
using BlockId = int32_t;

// A share of the seats and KV blocks kept for one lane (RequestSpec::lane):
// while the lane has waiting work, other lanes may not be admitted into the
// part of its share it does not use. Rule in scheduler/core/README.md.
struct LaneReservation {
  std::string lane;                  // non-empty, unique
  double min_seqs_fraction = 0.0;    // of the step's max_num_seqs, rounded down
  double min_blocks_fraction = 0.0;  // of num_kv_blocks, rounded down
};

// The time to first token a lane's requests aim at (SchedulerConfig::lane_ttft).
struct LaneTtft {
  std::string lane;
  double ttft_ms = 0;  // > 0
};

struct SchedulerConfig {
  int32_t max_num_seqs = 256;
  int32_t max_num_batched_tokens = 8192;
  int32_t max_model_len = 0;  // prompt + generated tokens may not exceed this
  int32_t block_size = 16;    // tokens per KV block
  int32_t num_kv_blocks = 0;  // KV blocks the worker holds
  // vLLM's --enable-prefix-caching: full computed blocks are shared by hash.
  bool enable_prefix_caching = false;
  // Most distinct LoRA adapters (RequestSpec::lora_name) among the running sequences, so every
  // step runs within the workers' --max-loras; a waiting request of another adapter waits for
  // one to leave. 0: no bound (a replica without adapters takes none).
  int32_t max_loras = 0;
  // The adapters the workers serve at start (--lora-modules): the engine loop's LoraTable starts
  // from them (scheduler/lora_table.h). Not read by the core, which sees only each request's key.
  std::vector<std::string> lora_modules;
  // Each full interval waited since arrival raises a sequence's effective
  // priority by one. 0: no aging (strict priority).
  int32_t aging_interval_ms = 0;
  // Within a priority, waiting sequences already past their first_token_target go after
  // those that can still meet it (in arrival order each). In an overload, first come first
  // served spends every seat on requests that are already late.
  bool serve_late_last = false;
  // serve_late_last: a request's first_token_target, when it has none, is its arrival plus
  // its lane's ttft_ms here, or plus default_ttft_ms for a lane not listed (0: never late).
  std::vector<LaneTtft> lane_ttft;
  double default_ttft_ms = 0;
  // Fractions summing to at most 1; lanes without an entry reserve nothing.
  std::vector<LaneReservation> lane_reservations;
  // Plans that may be out (planned, not yet committed) at once, 1..4. 1: the
  // caller commits each step before planning the next. 2 lets it plan step
  // N+1 while the worker runs step N (vLLM's async scheduling): the planner
  // counts on one token from every sequence that samples in N before knowing
  // it (contract in scheduler/core/README.md, "Steps in flight").
  int32_t max_steps_in_flight = 1;
  // Tokens one step may send in new_sequences (each is sent whole, prompt and all, when it first
  // runs or resumes): what keeps a StepRequest under the worker channel's message limit, whatever
  // max_num_seqs and the prompt lengths. The default: 64 MiB at 8 bytes a token (an int32 varint
  // is at most 5, plus the message's own fields). A sequence must fit in one step:
  // max_model_len <= this.
  int32_t max_step_sent_tokens = 8 << 20;
  // Test only (--debug-leak-kv-every): every Nth sequence retired keeps its KV blocks for good.
  // The soak test's leaky control (scripts/soak.sh), which must make it fail. 0: off.
  int32_t debug_leak_kv_every = 0;
  // Test only (--debug-leak-bytes-per-request): every sequence retired leaves this many bytes of
  // heap behind, written so that they are resident. The soak's negative control for its RSS
  // criterion (scripts/soak.sh), which must make it fail. 0: off.
  int64_t debug_leak_bytes_per_request = 0;
};

// Per-step limits; passed to every Plan so a controller can change them per step.
struct Budget {
  int32_t max_num_seqs = 256;
  int32_t max_num_batched_tokens = 8192;
};

// How the worker picks each token (ferry.v1.SamplingParams, proto/ferry/v1/sampling.proto). The
// scheduler reads the few fields below; the rest it carries to the worker as the gateway sent it,
// so no sampling field is copied by hand on its way through (scheduler_service.cc decodes what it
// reads, worker_client.cc puts the message in each NewSequence).
struct SamplingParams {
  // Before min_tokens tokens were generated the worker does not sample these (EOS unless
  // ignored, and the stop token ids), and they end nothing.
  int32_t min_tokens = 0;
  std::vector<int32_t> min_tokens_suppressed_ids;
  // -1 none; N >= 0: each prompt token's logprob after the first plus the top N. The planner
  // never serves such a sequence from the prefix cache: every prompt position is computed.
  int32_t prompt_logprobs = -1;
  // Speculative decoding as resolved from the request and the workers' default: the method the
  // worker proposes drafts with (kNone: off) and the most draft slots a step reserves.
  SpeculativeMethod speculative_method = SpeculativeMethod::kNone;
  int32_t num_speculative_tokens = 0;  // [0, kMaxSpeculativeTokens]; 0 with kNone
  std::string encoded;  // the whole ferry.v1.SamplingParams, in its wire encoding
};

// Log-probability of a sampled token and the most likely alternatives.
struct TokenLogprob {
  int32_t token_id = -1;  // set for prompt tokens; a sampled token's is the event's token
  float logprob = 0.0f;
  int32_t rank = 0;       // prompt tokens: 1 + the number of more likely tokens
  std::vector<std::pair<int32_t, float>> top;  // (token id, logprob), most likely first
};

// A validated, tokenised request. seq_id is chosen by the caller and must be
// unique among live sequences.
struct RequestSpec {
  uint64_t seq_id = 0;
  std::string request_id;
  std::vector<int32_t> prompt;
  // A resume: tokens an earlier attempt generated (fewer than max_tokens). The sequence starts
  // with prompt + these, as one preempted after generating them would; its events carry only
  // what it samples after them.
  std::vector<int32_t> generated;
  int32_t max_tokens = 16;
  SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;
  std::vector<int32_t> eos_token_ids;
  bool ignore_eos = false;
  int32_t priority = 0;  // larger runs first (raised by aging while it waits)
  TimePoint arrival{};
  std::string lane;  // reservation lane (SchedulerConfig::lane_reservations); "" none
  // Waiting at this time: ends with kDeadlineExceeded (never started) or
  // kTimeout (started: its tokens so far were delivered). Running: kTimeout.
  TimePoint deadline = TimePoint::max();
  // Not yet sent to the worker at this time: ends with kQueueTimeout (a lane's queue timeout).
  TimePoint queue_deadline = TimePoint::max();
  // Its first token is late after this time. A never-started sequence still waiting past it
  // is served after those of its priority that can still be on time (SchedulerConfig::
  // serve_late_last). max: Add sets it from the lane's target (SchedulerConfig::lane_ttft).
  TimePoint first_token_target = TimePoint::max();
  // The LoRA adapter it runs under (SubmitRequest.lora_name); empty: the base model. Its blocks
  // are cached under it (the prefix cache's chain starts from the adapter's root), and a step
  // runs at most SchedulerConfig::max_loras distinct adapters.
  std::string lora_name;
};

// A sequence the worker has no state for, sent in full once (ferry.v1.NewSequence).
struct NewSequence {
  uint64_t seq_id = 0;
  std::vector<int32_t> token_ids;  // prompt + tokens generated before a preemption
  int32_t num_generated = 0;       // how many of token_ids were generated
  SamplingParams sampling;
  // Positions [0, num_cached_tokens) are already in the first blocks of this
  // sequence's first new_block_ids (shared prefix-cache blocks, which it must
  // not write); computing starts here. Always a multiple of block_size and
  // < token_ids.size().
  int32_t num_cached_tokens = 0;
  std::string lora_name;  // RequestSpec::lora_name
};

// One sequence's share of a step (ferry.v1.ScheduledSequence).
struct ScheduledSequence {
  uint64_t seq_id = 0;
  int32_t num_tokens = 0;               // starting at the first uncomputed token
  std::vector<BlockId> new_block_ids;   // appended to the block table this step
  // Speculative decoding: draft slots after those tokens, covered by new_block_ids. The step then
  // samples 1 to 1 + this many tokens; the slots of rejected drafts are rolled back at Commit.
  int32_t num_lookahead_tokens = 0;
};

// The decision for one engine step (ferry.v1.StepRequest). A worker applies
// finished_ids and preempted_ids before new_sequences and scheduled: the
// blocks of forgotten sequences may be handed to others in the same plan.
struct StepPlan {
  uint64_t step_id = 0;  // 0 for an empty plan; otherwise 1, 2, 3, ...
  std::vector<NewSequence> new_sequences;    // each is also in scheduled
  std::vector<ScheduledSequence> scheduled;  // sequences that run this step
  std::vector<uint64_t> finished_ids;        // worker forgets these
  std::vector<uint64_t> preempted_ids;       // worker forgets; they return as new

  bool empty() const {
    return new_sequences.empty() && scheduled.empty() && finished_ids.empty() &&
           preempted_ids.empty();
  }
  int32_t num_scheduled_tokens() const {
    int32_t total = 0;
    for (const auto& s : scheduled) total += s.num_tokens;
    return total;
  }
};

// A sequence's samples of one step are consecutive, in position order (several only with lookahead).
struct SampledToken {
  uint64_t seq_id = 0;
  int32_t token_id = 0;
  std::optional<TokenLogprob> logprob;  // when the request asked for logprobs
};

// Logprobs of prompt tokens first_index, first_index + 1, ... of one sequence, computed in a
// step (ferry.v1.PromptLogprobs). A recomputed sequence sends them again; Commit forwards each
// index once.
struct PromptLogprobs {
  uint64_t seq_id = 0;
  int32_t first_index = 1;
  std::vector<TokenLogprob> logprobs;
};

// What the workers return for one step.
// A new sequence the workers refused alone (StepResult.sequence_errors): the rest of its step ran.
struct SequenceError {
  uint64_t seq_id = 0;
  std::string message;  // names the field, the value and the limit
};

struct StepOutput {
  std::vector<SampledToken> sampled;
  std::vector<PromptLogprobs> prompt_logprobs;
  std::vector<SequenceError> refused;
};

// The tokens of one event, read like a std::vector<int32_t>. A step samples at most one token per
// sequence, plus its accepted drafts under speculative decoding, so they are held in place: a
// step's events cost no allocation per sequence (#26).
class EventTokens {
 public:
  using value_type = int32_t;
  using const_iterator = const int32_t*;
  using iterator = const_iterator;
  static constexpr size_t kCapacity = 1 + kMaxSpeculativeTokens;

  EventTokens() = default;
  EventTokens(std::initializer_list<int32_t> tokens) {
    for (int32_t t : tokens) push_back(t);
  }
  // Throws std::length_error past kCapacity: an event never carries more than one step's sample.
  void push_back(int32_t token) {
    if (size_ == kCapacity) throw std::length_error("EventTokens: more than one token in an event");
    tokens_[size_++] = token;
  }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const int32_t* data() const { return tokens_.data(); }
  const_iterator begin() const { return tokens_.data(); }
  const_iterator end() const { return tokens_.data() + size_; }
  int32_t operator[](size_t i) const { return tokens_[i]; }
  int32_t at(size_t i) const {
    if (i >= size_) throw std::out_of_range("EventTokens::at");
    return tokens_[i];
  }
  friend bool operator==(const EventTokens& a, const EventTokens& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend bool operator==(const EventTokens& a, const std::vector<int32_t>& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  std::array<int32_t, kCapacity> tokens_{};
  size_t size_ = 0;
};

// kDeadlineExceeded: dropped while waiting, before it ever started, at its deadline.
// kQueueTimeout: not sent to the worker by its lane's queue timeout (before its deadline): the
// replica is overloaded, and a retry may be served.
// kTimeout: stopped at its deadline after it started (running or preempted).
// kAborted: the engine failed it (a step error: a bug). kUnavailable: its workers were lost and
// not back in time (the engine loop's recovery timeout); a retry may succeed.
enum class FinishKind {
  kNone, kLength, kEos, kStopToken, kAborted, kCancelled, kDeadlineExceeded, kTimeout, kUnavailable, kQueueTimeout,
  kRefused,  // the workers refused the sequence (SeqEvent::error says why): INVALID_ARGUMENT
  kNotFound,  // its LoRA adapter is not served (unloaded): NOT_FOUND, SeqEvent::error says which
};

// What a sequence produced in one Commit (or AbortAll, or Plan: its first scheduling, a deadline).
// A finished sequence gets exactly one event with finish != kNone, its last. (Members without a
// default are `{}` so that designated initializers may leave them out without a warning.)
struct SeqEvent {
  uint64_t seq_id = 0;
  EventTokens new_tokens{};  // includes a final eos/stop token
  std::vector<TokenLogprob> logprobs{};  // one per new token when requested, else empty
  FinishKind finish = FinishKind::kNone;
  // The next prompt tokens' logprobs (prompt_logprobs requests), in prompt order, each once;
  // all of them come before or with the first new token.
  std::vector<TokenLogprob> prompt_logprobs{};
  // Set on the event of its first scheduling (from Plan, before any token): the Plan's `now` (the
  // end of its queue time) and the prompt tokens the prefix cache held then.
  std::optional<TimePoint> first_scheduled{};
  int32_t num_cached_tokens = 0;
  // Set on the final event, since the core forgets the sequence then: what the caller's
  // per-request measurements (TTFT, TPOT per lane) need of it.
  std::string lane{};
  TimePoint arrival{};
  int32_t num_prompt_tokens = 0;  // with a resume's given tokens (RequestSpec::generated)
  int32_t num_generated = 0;  // the tokens of all its events
  std::string error{};  // kRefused: the workers' reason; kNotFound: the adapter
};

const char* FinishKindName(FinishKind kind);

}  // namespace ferry::scheduler
