#include "scheduler/scheduler_service.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include <prometheus/counter.h>
#include <spdlog/spdlog.h>

#include "common/lora_name.h"
#include "common/sampling_limits.h"
#include "common/speculative.h"
#include "proto/speculative.h"

namespace ferry::scheduler {

namespace {

// The one place a wire SamplingParams becomes the scheduler's: what the planner reads, and the
// message itself to carry to the workers.
SamplingParams ToSamplingParams(const ferry::v1::SamplingParams& s) {
  return SamplingParams{.min_tokens = s.min_tokens(),
                        .prompt_logprobs = s.has_prompt_logprobs() ? s.prompt_logprobs() : -1,
                        .encoded = s.SerializeAsString()};
}

RequestSpec ToRequestSpec(const ferry::v1::SubmitRequest& r, const std::vector<int32_t>& eos_ids) {
  RequestSpec spec;
  spec.request_id = r.request_id();
  spec.prompt.assign(r.prompt_token_ids().begin(), r.prompt_token_ids().end());
  spec.generated.assign(r.generated_token_ids().begin(), r.generated_token_ids().end());
  const ferry::v1::SamplingParams& s = r.sampling();
  spec.max_tokens = s.max_tokens();
  spec.sampling = ToSamplingParams(s);
  spec.stop_token_ids.assign(s.stop_token_ids().begin(), s.stop_token_ids().end());
  spec.eos_token_ids = eos_ids;
  spec.ignore_eos = s.ignore_eos();
  SamplingParams& p = spec.sampling;
  if (p.min_tokens > 0) {
    if (!spec.ignore_eos) p.min_tokens_suppressed_ids = eos_ids;
    p.min_tokens_suppressed_ids.insert(p.min_tokens_suppressed_ids.end(), spec.stop_token_ids.begin(),
                                       spec.stop_token_ids.end());
  }
  spec.priority = r.priority();
  spec.lane = r.lane();
  spec.lora_name = r.lora_name();
  return spec;
}

// A replica without adapters refuses a named one here; which adapters are served the engine loop
// decides (it ends a request under one not served, or unloaded meanwhile, NOT_FOUND).
void CheckLora(const ferry::v1::SubmitRequest& r, const ferry::v1::SchedulerInfo& info) {
  if (r.lora_name().empty() || info.max_loras() > 0) return;
  throw std::invalid_argument(fmt::format(
      "lora_name = \"{}\": this replica serves no LoRA adapters (its workers run without --enable-lora)", r.lora_name()));
}

grpc::Status ToStatus(const LoraChange& change, ferry::v1::LoraAdaptersResponse* out) {
  using Code = LoraChange::Code;
  for (const std::string& name : change.names) out->add_lora_names(name);
  switch (change.code) {
    case Code::kOk: return grpc::Status::OK;
    case Code::kInvalidArgument: return {grpc::StatusCode::INVALID_ARGUMENT, change.message};
    case Code::kAlreadyExists: return {grpc::StatusCode::ALREADY_EXISTS, change.message};
    case Code::kNotFound: return {grpc::StatusCode::NOT_FOUND, change.message};
    case Code::kFailedPrecondition: return {grpc::StatusCode::FAILED_PRECONDITION, change.message};
    case Code::kUnavailable: return {grpc::StatusCode::UNAVAILABLE, change.message};
  }
  return {grpc::StatusCode::INTERNAL, change.message};
}

void ToProto(const LoopState& s, ferry::v1::SchedulerState* out) {
  out->set_max_num_seqs(s.max_num_seqs);
  out->set_controller_mode(s.controller_mode);
  out->set_load_level(s.load_level);
  out->set_num_running(s.num_running);
  out->set_num_waiting(s.num_waiting);
  out->set_kv_cache_usage(s.kv_cache_usage);
  out->set_num_preemptions(s.num_preemptions);
  out->set_prefix_cache_queries(s.prefix_cache_queries);
  out->set_prefix_cache_hits(s.prefix_cache_hits);
  out->set_num_cap_changes(s.num_cap_changes);
  out->set_cap_held(s.cap_held);
  out->mutable_lora_names()->Assign(s.lora_names.begin(), s.lora_names.end());
  out->mutable_running_lora_adapters()->Assign(s.running_lora_adapters.begin(), s.running_lora_adapters.end());
}

ferry::v1::FinishKind ToProto(FinishKind kind) {
  switch (kind) {
    case FinishKind::kNone: return ferry::v1::FINISH_KIND_NONE;
    case FinishKind::kLength: return ferry::v1::FINISH_KIND_LENGTH;
    case FinishKind::kEos: return ferry::v1::FINISH_KIND_EOS;
    case FinishKind::kStopToken: return ferry::v1::FINISH_KIND_STOP_TOKEN;
    case FinishKind::kTimeout: return ferry::v1::FINISH_KIND_TIMEOUT;
    default: return ferry::v1::FINISH_KIND_ABORTED;
  }
  return ferry::v1::FINISH_KIND_ABORTED;
}

}  // namespace

grpc::Status SchedulerService::Info(grpc::ServerContext*, const ferry::v1::SchedulerInfoRequest*,
                                    ferry::v1::SchedulerInfo* out) {
  *out = info_;
  const std::vector<std::string> names = loop_.LoraNames();
  out->mutable_lora_names()->Assign(names.begin(), names.end());
  return grpc::Status::OK;
}

grpc::Status SchedulerService::LoadLoraAdapter(grpc::ServerContext*, const ferry::v1::LoadLoraAdapterRequest* request,
                                               ferry::v1::LoraAdaptersResponse* out) {
  if (const std::string error = LoraNameError(request->lora_name()); !error.empty()) {
    return {grpc::StatusCode::INVALID_ARGUMENT, error};
  }
  if (request->lora_path().empty()) return {grpc::StatusCode::INVALID_ARGUMENT, "lora_path is empty"};
  return ToStatus(loop_.LoadLora(request->lora_name(), request->lora_path()), out);
}

grpc::Status SchedulerService::UnloadLoraAdapter(grpc::ServerContext*, const ferry::v1::UnloadLoraAdapterRequest* request,
                                                 ferry::v1::LoraAdaptersResponse* out) {
  if (request->lora_name().empty()) return {grpc::StatusCode::INVALID_ARGUMENT, "lora_name is empty"};
  return ToStatus(loop_.UnloadLora(request->lora_name()), out);
}

namespace {

void ToProto(const TokenLogprob& in, int32_t token_id, ferry::v1::TokenLogprob* out) {
  out->set_token_id(token_id);
  out->set_logprob(in.logprob);
  if (in.rank > 0) out->set_rank(in.rank);
  for (const auto& [id, logprob] : in.top) {
    auto* top = out->add_top();
    top->set_token_id(id);
    top->set_logprob(logprob);
  }
}

// A bad value would fail the worker's whole step, every sequence in it with it.
void CheckPromptLogprobs(const ferry::v1::SubmitRequest& r, const ferry::v1::SchedulerInfo& info) {
  const ferry::v1::SamplingParams& s = r.sampling();
  if (!s.has_prompt_logprobs()) return;
  if (s.prompt_logprobs() < 0 || s.prompt_logprobs() > kMaxLogprobs) {
    throw std::invalid_argument(
        fmt::format("prompt_logprobs = {} must be in [0, {}]", s.prompt_logprobs(), kMaxLogprobs));
  }
  if (!info.supports_prompt_logprobs()) {
    throw std::invalid_argument("prompt_logprobs is not supported by this replica's worker backend");
  }
}

// What the replica can refuse without compiling anything: guided decoding on a backend without it, and the
// shapes that leave the worker nothing to match. A schema, a regex or a grammar is compiled by the gateway
// (its check) and by the worker (its matcher); one that does not compile (a client calling the scheduler
// directly) is refused by the worker alone, with the reason (StepResult.sequence_errors: INVALID_ARGUMENT),
// and the rest of its step runs.
void CheckGuided(const ferry::v1::SubmitRequest& r, const ferry::v1::SchedulerInfo& info) {
  const ferry::v1::GuidedDecoding& g = r.sampling().guided();
  if (g.kind_case() == ferry::v1::GuidedDecoding::KIND_NOT_SET) return;
  if (!info.supports_guided_decoding()) {
    throw std::invalid_argument("guided decoding is not supported by this replica's worker backend");
  }
  if (g.has_json_object() && !g.json_object()) {
    throw std::invalid_argument("guided.json_object = false must be true when set");
  }
  if (g.has_choice() && g.choice().choices_size() == 0) {
    throw std::invalid_argument("guided.choice.choices (count) = 0 must be at least 1");
  }
}

// vLLM's server-wide --speculative-config, per request: the request's method and count where it
// gives them, else the workers' default. Resolved here, since the planner reserves the drafts' KV slots;
// refused here (naming field, value and limit) when the replica's workers cannot propose with it.
void ResolveSpeculative(const ferry::v1::SubmitRequest& r, const ferry::v1::SchedulerInfo& info, SamplingParams& out) {
  const ferry::v1::SpeculativeDecoding& asked = r.sampling().speculative();
  const ferry::v1::SpeculativeDecoding& server = info.speculative();
  const std::optional<SpeculativeMethod> asked_method = FromProto(asked.method());
  if (!asked_method) {  // the gateway refuses these; a direct client may send one
    throw std::invalid_argument(fmt::format("sampling.speculative.method = {} is not a SpeculativeMethod",
                                            static_cast<int>(asked.method())));
  }
  SpeculativeMethod method = *asked_method;
  if (method == SpeculativeMethod::kDefault) method = FromProto(server.method()).value_or(SpeculativeMethod::kNone);
  if (method == SpeculativeMethod::kDefault) method = SpeculativeMethod::kNone;
  const auto& methods = info.speculative_methods();
  if (Speculates(method) && std::find(methods.begin(), methods.end(), ToProto(method)) == methods.end()) {
    std::string supported(SpeculativeMethodName(SpeculativeMethod::kNone));
    for (const int m : methods) supported += ", " + std::string(SpeculativeMethodName(static_cast<SpeculativeMethod>(m)));
    throw std::invalid_argument(fmt::format("sampling.speculative.method = '{}' is not supported by this replica's "
                                            "workers (supported: {})", SpeculativeMethodName(method), supported));
  }
  int32_t k = kDefaultSpeculativeTokens;
  if (asked.has_num_speculative_tokens()) {
    k = asked.num_speculative_tokens();
  } else if (ToProto(method) == server.method() && server.num_speculative_tokens() > 0) {
    k = server.num_speculative_tokens();
  }
  if (k < 0 || k > kMaxSpeculativeTokens) {
    throw std::invalid_argument(fmt::format("sampling.speculative.num_speculative_tokens = {} must be in [0, {}]", k,
                                            kMaxSpeculativeTokens));
  }
  const bool on = Speculates(method) && k > 0;
  out.speculative_method = on ? method : SpeculativeMethod::kNone;
  out.num_speculative_tokens = on ? k : 0;
}

// Fills `out` (a reused message: cleared, its storage kept) with the event's tokens and finish.
void ToTokenEvent(const SeqEvent& event, ferry::v1::TokenEvent* out) {
  out->mutable_token_ids()->Add(event.new_tokens.begin(), event.new_tokens.end());
  for (size_t i = 0; i < event.logprobs.size() && i < event.new_tokens.size(); ++i) {
    ToProto(event.logprobs[i], event.new_tokens[i], out->add_logprobs());
  }
  for (const TokenLogprob& lp : event.prompt_logprobs) ToProto(lp, lp.token_id, out->add_prompt_logprobs());
  out->set_finish(ToProto(event.finish));
}

// The retry hint of a request ended UNAVAILABLE. Another replica may serve it at once; this one
// probes its workers every 250 ms, and a restarted worker takes seconds to load.
constexpr int64_t kUnavailableRetryMs = 1000;

// The status that ends a request for an event the loop ends it with, if it carries no tokens to send.
std::optional<grpc::Status> EndStatus(const SeqEvent& event) {
  switch (event.finish) {
    case FinishKind::kRefused: return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, event.error);
    case FinishKind::kNotFound: return grpc::Status(grpc::StatusCode::NOT_FOUND, event.error);
    case FinishKind::kCancelled: return grpc::Status::CANCELLED;
    case FinishKind::kDeadlineExceeded:
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the request was not started within its deadline");
    case FinishKind::kQueueTimeout:  // TokenEvent.queue_timeout says which of the two
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          "the request was not started within its lane's queue timeout: the replica is overloaded");
    case FinishKind::kAborted: return grpc::Status(grpc::StatusCode::ABORTED, "the engine failed this request");
    case FinishKind::kUnavailable:
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "the replica's worker group was lost and is not back within --worker-recovery-timeout-s; "
                          "retry (another replica may serve it)");
    default: return std::nullopt;
  }
}

using ferry::v1::SessionEvents;
using ferry::v1::SessionRequests;

// One gateway session (Scheduler.Session) as a callback reactor: it reads submits and cancels,
// hands each request to the loop with itself as the request's EventSink, and writes what the
// loop delivered as one message per flush, with whatever queued while a write was in flight.
// The loop never waits on it: Deliver appends under a short lock; Flush starts a write only
// when none is in flight (OnWriteDone starts the next).
//
// Lifetime: shared. gRPC's share (self_) lasts from the call until OnDone, the loop's while it
// holds live requests of the session. Nothing starts a gRPC operation once Finish was called.
class SessionReactor final : public grpc::ServerBidiReactor<SessionRequests, SessionEvents>,
                             public EventSink,
                             public std::enable_shared_from_this<SessionReactor> {
 public:
  SessionReactor(EngineLoop& loop, const ferry::v1::SchedulerInfo& info, const Replays& replays)
      : loop_(loop), info_(info), eos_(info.eos_token_ids().begin(), info.eos_token_ids().end()), replays_(replays) {}

  void Begin() {
    self_ = shared_from_this();
    StartRead(&in_);
  }

  // The scheduler drains: new requests are refused (UNAVAILABLE: the gateway tries another
  // replica) and the session ends once the requests on it have.
  void Drain() {
    {
      std::lock_guard lock(mu_);
      draining_ = true;
      closing_ = true;
    }
    Flush();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the gateway closed its side (or went away: OnCancel ends the session then)
      {
        std::lock_guard lock(mu_);
        closing_ = true;
      }
      return Flush();
    }
    const TimePoint arrival = Clock::now();
    for (const ferry::v1::SessionSubmit& submit : in_.submits()) {
      if (!Admit(submit, arrival)) return;  // the session is over
    }
    for (const uint64_t id : in_.cancels()) {
      std::optional<uint64_t> seq_id;
      {
        std::lock_guard lock(mu_);
        if (auto it = live_.find(id); it != live_.end()) {
          seq_id = it->second.seq_id;
          Orphan(it->second, id);
          live_.erase(it);  // its later events are not sent
        }
      }
      if (seq_id) loop_.Cancel(*seq_id);
    }
    Flush();  // refusals
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    std::optional<grpc::Status> finish;
    {
      std::lock_guard lock(mu_);
      writing_ = false;
      if (finishing_ && !finished_) {
        finished_ = true;
        finish = finish_status_;
      }
    }
    if (finish) return Finish(*finish);
    if (!ok) return End(grpc::Status::CANCELLED);  // the gateway went away mid-write
    Flush();
  }

  void OnCancel() override { End(grpc::Status::CANCELLED); }
  void OnDone() override {
    std::shared_ptr<SessionReactor> last = std::move(self_);  // may be the last share
  }

  void Deliver(uint64_t tag, const SeqEvent& event) override {
    std::lock_guard lock(mu_);
    auto it = live_.find(tag);
    if (it == live_.end()) return KeepOrphan(tag, event);  // cancelled by the gateway, or the session ended
    ferry::v1::TokenEvent* out = pending_.add_events();
    out->set_stream_id(tag);
    if (const auto end = EndStatus(event)) {
      out->set_status_code(end->error_code());
      out->set_status_message(end->error_message());
      if (end->error_code() == grpc::StatusCode::UNAVAILABLE) out->set_retry_after_ms(kUnavailableRetryMs);
      out->set_queue_timeout(event.finish == FinishKind::kQueueTimeout);
    } else {
      ToTokenEvent(event, out);
    }
    if (!it->second.started) {
      it->second.started = true;
      const auto started = event.first_scheduled.value_or(Clock::now());
      // Never negative: `arrival` was read before the request went into the loop's inbox, `started`
      // by the loop after it took it out, and the steady clock is monotonic across cores
      // (docs/benchmarks/bench.md 2k, "One clock").
      out->set_queue_s(std::chrono::duration<double>(started - it->second.arrival).count());
      out->set_num_cached_tokens(event.num_cached_tokens);
    }
    if (!it->second.key.empty()) Keep(it->second, *out, event.finish);
    if (event.finish != FinishKind::kNone) live_.erase(it);
  }

  // Starts a write of everything pending unless one is in flight. A session the gateway closed
  // finishes once its last request's events are out.
  void Flush() override {
    bool finish = false;
    {
      std::lock_guard lock(mu_);
      if (writing_ || finishing_) return;
      if (pending_.events_size() == 0) {
        if (!closing_ || !live_.empty()) return;
        finishing_ = finished_ = finish = true;
      } else {
        out_.Swap(&pending_);
        pending_.Clear();  // keeps its events' storage for the next deliveries
        writing_ = true;
      }
    }
    if (finish) return Finish(grpc::Status::OK);
    StartWrite(&out_);
  }

 private:
  struct Live {
    uint64_t seq_id = 0;
    TimePoint arrival;
    bool started = false;  // its first event (queue_s) was sent
    std::string key;       // SubmitRequest.idempotency_key; empty: none
    uint64_t fingerprint = 0;
    std::vector<ferry::v1::TokenEvent> record;  // the events sent so far, when keyed
  };

  // A keyed request's event, kept; once it finished with its answer (not ended early), the
  // events are the key's record.
  void Keep(Live& live, const ferry::v1::TokenEvent& event, FinishKind finish) {
    ferry::v1::TokenEvent& kept = live.record.emplace_back(event);
    kept.clear_stream_id();
    if (finish == FinishKind::kLength || finish == FinishKind::kEos || finish == FinishKind::kStopToken) {
      replays_.records->Add(live.key, {live.fingerprint, std::move(live.record)}, Clock::now());
    }
  }

  // A keyed request whose events are no longer sent (cancelled, or the session ended) may still
  // finish with its answer in the step under way: its record is still kept, so that the request
  // sent again (by the gateway that takes the line over) is answered from it. Under mu_.
  void Orphan(Live& live, uint64_t id) {
    if (!live.key.empty()) orphans_.emplace(id, std::move(live));
  }
  void KeepOrphan(uint64_t tag, const SeqEvent& event) {
    auto it = orphans_.find(tag);
    if (it == orphans_.end()) return;
    if (!EndStatus(event)) {
      ferry::v1::TokenEvent out;
      ToTokenEvent(event, &out);
      Keep(it->second, out, event.finish);
    }
    if (event.finish != FinishKind::kNone) orphans_.erase(it);
  }

  // Answers a keyed request from its record; false when there is none (it runs). A record of
  // another request under the same key refuses it.
  bool Replay(uint64_t id, const ferry::v1::SubmitRequest& request, uint64_t fingerprint) {
    auto record = replays_.records->Find(request.idempotency_key(), Clock::now());
    if (!record) return false;
    if (record->fingerprint != fingerprint) {
      Refuse(id, grpc::StatusCode::INVALID_ARGUMENT,
             "idempotency_key: a different request was answered under this key; use a new key for a new request");
      return true;
    }
    {
      std::lock_guard lock(mu_);
      for (size_t i = 0; i < record->events.size(); ++i) {
        ferry::v1::TokenEvent* out = pending_.add_events();
        *out = std::move(record->events[i]);
        out->set_stream_id(id);
        if (i == 0) out->set_queue_s(0);  // it never queued
      }
    }
    if (replays_.replayed != nullptr) replays_.replayed->Increment();
    spdlog::debug("req={} answered from the record of its idempotency key", request.request_id());
    return true;
  }

  // Hands one submit to the loop, or queues its refusal. A stream id already live would make
  // every later event of the two ambiguous: the gateway broke the protocol, and the session ends
  // (false).
  bool Admit(const ferry::v1::SessionSubmit& submit, TimePoint arrival) {
    const uint64_t id = submit.stream_id();
    const ferry::v1::SubmitRequest& request = submit.request();
    bool duplicate = false, draining = false;
    {
      std::lock_guard lock(mu_);
      duplicate = live_.count(id) > 0;
      draining = draining_;
    }
    if (draining) {
      Refuse(id, grpc::StatusCode::UNAVAILABLE, "the scheduler is draining; submit to another replica");
      return true;
    }
    if (duplicate) {
      End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                       fmt::format("stream_id = {} is already live on this session", id)));
      return false;
    }
    try {
      CheckPromptLogprobs(request, info_);
      CheckGuided(request, info_);
      CheckLora(request, info_);
      if (submit.timeout_ms() < 0) {
        throw std::invalid_argument(fmt::format("timeout_ms = {} must be >= 0", submit.timeout_ms()));
      }
      const uint64_t fingerprint = request.idempotency_key().empty() ? 0 : SubmitFingerprint(request);
      if (!request.idempotency_key().empty() && Replay(id, request, fingerprint)) return true;
      RequestSpec spec = ToRequestSpec(request, eos_);
      ResolveSpeculative(request, info_, spec.sampling);
      spec.arrival = arrival;  // one reading for the core (TTFT, aging, queue deadline) and queue_s
      if (submit.timeout_ms() > 0) spec.deadline = arrival + std::chrono::milliseconds(submit.timeout_ms());
      if (request.queue_timeout_ms() > 0) {
        spec.queue_deadline = arrival + std::chrono::milliseconds(request.queue_timeout_ms());
      }
      {
        std::lock_guard lock(mu_);
        live_.emplace(id, Live{.arrival = arrival, .key = request.idempotency_key(), .fingerprint = fingerprint});
      }
      try {
        const uint64_t seq_id = loop_.Submit(std::move(spec), shared_from_this(), id);
        std::lock_guard lock(mu_);
        // The loop may have ended it already (and the entry with it).
        if (auto it = live_.find(id); it != live_.end()) it->second.seq_id = seq_id;
        spdlog::debug("req={} seq={} queued ({} prompt tokens)", request.request_id(), seq_id,
                      request.prompt_token_ids_size());
      } catch (const std::invalid_argument&) {
        std::lock_guard lock(mu_);
        live_.erase(id);
        throw;
      }
    } catch (const std::invalid_argument& e) {
      Refuse(id, grpc::StatusCode::INVALID_ARGUMENT, e.what());
    }
    return true;
  }

  // Queues the end of a request that never reached the loop.
  void Refuse(uint64_t id, grpc::StatusCode code, const std::string& message) {
    std::lock_guard lock(mu_);
    ferry::v1::TokenEvent* out = pending_.add_events();
    out->set_stream_id(id);
    out->set_status_code(code);
    out->set_status_message(message);
  }

  // The session is over: every request on it is cancelled, and the call finishes once no write
  // is in flight.
  void End(const grpc::Status& status) {
    std::vector<uint64_t> cancelled;
    bool finish = false;
    {
      std::lock_guard lock(mu_);
      if (finishing_) return;
      finishing_ = true;
      finish_status_ = status;
      for (auto& [id, live] : live_) {
        cancelled.push_back(live.seq_id);
        Orphan(live, id);
      }
      live_.clear();
      finish = !writing_;
      finished_ = finish;
    }
    for (const uint64_t seq_id : cancelled) loop_.Cancel(seq_id);
    if (finish) Finish(status);
  }

  EngineLoop& loop_;
  const ferry::v1::SchedulerInfo& info_;
  const std::vector<int32_t> eos_;
  const Replays& replays_;  // the service's, which outlives its sessions
  std::shared_ptr<SessionReactor> self_;
  SessionRequests in_;  // the read in flight (only gRPC's reactions touch it)

  std::mutex mu_;
  std::unordered_map<uint64_t, Live> live_;  // stream id -> its request, until its last event
  std::unordered_map<uint64_t, Live> orphans_;  // keyed requests no longer sent, until their last event
  SessionEvents pending_;  // delivered, not yet written
  SessionEvents out_;      // the write in flight (gRPC reads it until OnWriteDone)
  bool writing_ = false;
  bool closing_ = false;    // the gateway closed its side, or the scheduler drains: end once empty
  bool draining_ = false;   // the scheduler drains: submits are refused
  bool finishing_ = false;  // End was called: no more writes
  bool finished_ = false;   // Finish was called
  grpc::Status finish_status_;
};

}  // namespace

// The open sessions, for Drain.
struct SchedulerService::Sessions {
  std::mutex mu;
  std::vector<std::weak_ptr<SessionReactor>> open;  // ended ones are dropped at the next Session
  bool draining = false;
};

SchedulerService::SchedulerService(EngineLoop& loop, ferry::v1::SchedulerInfo info, Replays replays)
    : loop_(loop), info_(std::move(info)), sessions_(std::make_shared<Sessions>()), replays_(std::move(replays)) {}

grpc::ServerBidiReactor<SessionRequests, SessionEvents>* SchedulerService::Session(grpc::CallbackServerContext*) {
  auto session = std::make_shared<SessionReactor>(loop_, info_, replays_);
  session->Begin();
  bool draining = false;
  {
    std::lock_guard lock(sessions_->mu);
    std::erase_if(sessions_->open, [](const auto& weak) { return weak.expired(); });
    sessions_->open.push_back(session);
    draining = sessions_->draining;
  }
  if (draining) session->Drain();
  return session.get();
}

void SchedulerService::Drain() {
  std::vector<std::shared_ptr<SessionReactor>> open;
  {
    std::lock_guard lock(sessions_->mu);
    sessions_->draining = true;
    for (const auto& weak : sessions_->open) {
      if (auto session = weak.lock()) open.push_back(std::move(session));
    }
  }
  spdlog::info("draining {} gateway session(s): new requests refused, each ends once its requests have", open.size());
  for (const auto& session : open) session->Drain();
}

grpc::Status SchedulerService::GetState(grpc::ServerContext*, const ferry::v1::GetStateRequest*,
                                        ferry::v1::SchedulerState* out) {
  ToProto(loop_.State(), out);
  return grpc::Status::OK;
}

grpc::Status SchedulerService::SetMaxNumSeqs(grpc::ServerContext*, const ferry::v1::SetMaxNumSeqsRequest* request,
                                             ferry::v1::SchedulerState* out) {
  if (request->max_num_seqs() <= 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "max_num_seqs = " + std::to_string(request->max_num_seqs()) + " must be > 0");
  }
  spdlog::info("admin: max_num_seqs set to {}{}", request->max_num_seqs(),
               request->adapt() ? " (the controller may move it)" : " (held)");
  ToProto(loop_.SetMaxNumSeqs(request->max_num_seqs(), !request->adapt()), out);
  return grpc::Status::OK;
}

}  // namespace ferry::scheduler
