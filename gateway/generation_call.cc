#include "gateway/generation_call.h"

#include <xxhash.h>

#include <algorithm>
#include <random>
#include <span>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "gateway/gateway_metrics.h"

namespace ferry::gateway {

namespace {

using Clock = std::chrono::steady_clock;
using ferry::v1::FinishReason;

// `from` is always read first (the arrival, before anything is sent on), and the steady clock is
// monotonic across this machine's cores and processes (docs/benchmarks/bench.md 2k, "One
// clock"), so a negative interval would be a bug to find, not a value to clamp.
double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

uint64_t RandomU64() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

std::string NewRequestId() { return fmt::format("req-{:016x}", RandomU64()); }

FinishReason ToFinishReason(ferry::v1::FinishKind kind) {
  switch (kind) {
    case ferry::v1::FINISH_KIND_LENGTH: return ferry::v1::FINISH_REASON_LENGTH;
    case ferry::v1::FINISH_KIND_EOS: return ferry::v1::FINISH_REASON_EOS;
    case ferry::v1::FINISH_KIND_STOP_TOKEN: return ferry::v1::FINISH_REASON_STOP;
    case ferry::v1::FINISH_KIND_TIMEOUT: return ferry::v1::FINISH_REASON_TIMEOUT;
    default: return ferry::v1::FINISH_REASON_ERROR;
  }
}

// Copies a logprob entry, adding each token's own text, as OpenAI's logprobs show it.
void AddDecoded(const ferry::v1::TokenLogprob& in, int32_t token, const tokenizer::Tokenizer& tokenizer,
                ferry::v1::TokenLogprob* out) {
  *out = in;
  out->set_token_id(token);
  out->set_token(tokenizer.Decode(std::span<const int32_t>(&token, 1)));
  for (auto& top : *out->mutable_top()) {
    const int32_t id = top.token_id();
    top.set_token(tokenizer.Decode(std::span<const int32_t>(&id, 1)));
  }
}

// Puts `held` (a chunk not written yet) in front of `chunk`; `held` is left empty.
void Prepend(ferry::v1::GenerateChunk& held, ferry::v1::GenerateChunk& chunk) {
  if (held.token_ids_size() == 0 && held.text().empty() && held.prompt_logprobs_size() == 0) return;
  held.mutable_text()->append(chunk.text());
  held.mutable_token_ids()->Add(chunk.token_ids().begin(), chunk.token_ids().end());
  for (auto& lp : *chunk.mutable_logprobs()) held.add_logprobs()->Swap(&lp);
  for (auto& lp : *chunk.mutable_prompt_logprobs()) held.add_prompt_logprobs()->Swap(&lp);
  held.set_request_id(chunk.request_id());
  chunk.Swap(&held);
  held.Clear();
}

// The call's status once the scheduler stream has ended.
Status Outcome(bool client_cancelled, const Status& downstream, bool client_gone, StreamProgress& progress,
               const Lane& lane) {
  if (client_gone) return Status(StatusCode::kCancelled, "client went away");
  if (progress.reason != ferry::v1::FINISH_REASON_UNSPECIFIED) return Status();
  if (downstream.queue_timeout()) {  // never started: no partial text to end with
    const int64_t hint = LaneRetryHintMs(lane);
    return Status(StatusCode::kDeadlineExceeded,
                  fmt::format("lane \"{}\" did not start the request within its queue timeout of {} ms (the "
                              "replica is overloaded); retry after {} ms",
                              lane.name, lane.queue_timeout_ms, hint))
        .WithRetryAfter(hint)
        .AsQueueTimeout();
  }
  // The scheduler call ended without a finish: deadline, cancellation or failure.
  if (downstream.error_code() == StatusCode::kDeadlineExceeded) {
    progress.reason = ferry::v1::FINISH_REASON_TIMEOUT;
    progress.final_chunk.mutable_text()->append(progress.text.Finish());
    return Status();
  }
  if (client_cancelled) return Status(StatusCode::kCancelled, "cancelled by the client");
  if (downstream.ok()) return Status(StatusCode::kInternal, "scheduler ended the stream without a finish");
  const auto code =
      downstream.error_code() == StatusCode::kAborted ? StatusCode::kInternal : downstream.error_code();
  return Status(code, "scheduler: " + downstream.error_message()).WithRetryAfter(downstream.retry_after_ms());
}

}  // namespace

ferry::v1::GenerateChunk StreamProgress::Consume(const ferry::v1::TokenEvent& event,
                                                const tokenizer::Tokenizer& tokenizer) {
  ferry::v1::GenerateChunk chunk;
  if (first_prompt_token >= 0) {
    auto* head = chunk.add_prompt_logprobs();
    head->set_token_id(first_prompt_token);
    head->set_token(tokenizer.Decode(std::span<const int32_t>(&first_prompt_token, 1)));
    first_prompt_token = -1;
  }
  for (const auto& lp : event.prompt_logprobs()) {
    if (prompt_logprobs_to_skip > 0) {  // sent before a resume
      --prompt_logprobs_to_skip;
      continue;
    }
    ++prompt_logprobs_seen;
    AddDecoded(lp, lp.token_id(), tokenizer, chunk.add_prompt_logprobs());
  }
  // The token that ended the sequence (EOS, a stop token id) is counted but not written, unless
  // include_stop_str_in_output: vLLM's rule, which matters once special tokens are kept in the text.
  const bool ended_by_token =
      event.finish() == ferry::v1::FINISH_KIND_EOS || event.finish() == ferry::v1::FINISH_KIND_STOP_TOKEN;
  for (int i = 0; i < event.token_ids_size(); ++i) {
    const int32_t token = event.token_ids(i);
    chunk.add_token_ids(token);
    token_ids.push_back(token);
    if (i < event.logprobs_size()) AddDecoded(event.logprobs(i), token, tokenizer, chunk.add_logprobs());
    ++completion_tokens;
    if (ended_by_token && i + 1 == event.token_ids_size() && !text.include_stop()) break;
    chunk.mutable_text()->append(text.Add(token));
    if (text.stopped()) {
      reason = ferry::v1::FINISH_REASON_STOP;
      return chunk;
    }
  }
  if (event.finish() != ferry::v1::FINISH_KIND_NONE) {
    reason = ToFinishReason(event.finish());
    chunk.mutable_text()->append(text.Finish());
  }
  return chunk;
}

void CancelSource::Cancel() {
  std::lock_guard lock(mu_);
  is_cancelled_ = true;
  if (stream_ != nullptr) stream_->Cancel();
}

void CancelSource::SetStream(SchedulerStream* stream) {
  std::lock_guard lock(mu_);
  stream_ = stream;
  if (stream_ != nullptr && is_cancelled_) stream_->Cancel();
}

GenerationCall::GenerationCall(GenerationContext& context, CallHooks hooks)
    : context_(context), hooks_(std::move(hooks)) {}

GenerationCall::~GenerationCall() = default;

std::variant<Status, AdmittedRequest> GenerationCall::Admit(ferry::v1::GenerateRequest& request) {
  const auto arrival = Clock::now();
  if (request.request_id().empty()) request.set_request_id(NewRequestId());
  // A bad id is refused below; it is not written to the log.
  const std::string id = CheckRequestId(request.request_id()).empty() ? request.request_id() : "(invalid id)";
  auto validated = ValidateRequest(request, context_.options.limits, context_.options.lanes, context_.tokenizer);
  GatewayMetrics& metrics = context_.metrics;
  if (auto* error = std::get_if<ValidationError>(&validated)) {
    spdlog::info("req={} invalid: {}", id, error->message);
    metrics.invalid.Increment();
    metrics.requests.Add({{"lane", LaneLabel(context_.options.lanes, request.lane())}, {"code", "INVALID_ARGUMENT"}})
        .Increment();
    return Status(StatusCode::kInvalidArgument, error->message);
  }
  ValidatedRequest& v = std::get<ValidatedRequest>(validated);
  v.submit.set_request_id(id);
  if (v.submit.sampling().seed() == 0) {
    // A keyed request sent again (its gateway died) is the same request to the scheduler, which
    // answers it from its record: its seed comes from its key, not from chance.
    const std::string& key = v.submit.idempotency_key();
    v.submit.mutable_sampling()->set_seed((key.empty() ? RandomU64() : XXH3_64bits(key.data(), key.size())) | 1);
  }
  // A full lane answers at once; the ticket holds the place until the request starts.
  auto ticket = context_.queues.TryEnter(v.lane_rules);
  if (!ticket) {
    const int64_t hint = LaneRetryHintMs(v.lane_rules);
    retry_after_ms_ = hint;
    metrics.lane_full.Increment();
    metrics.requests.Add({{"lane", v.lane}, {"code", "RESOURCE_EXHAUSTED"}}).Increment();
    spdlog::info("req={} lane {} full ({} queued)", id, v.lane, v.lane_rules.max_queued);
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("lane \"{}\" is full ({} requests waiting); retry after {} ms", v.lane,
                              v.lane_rules.max_queued, hint))
        .WithRetryAfter(hint);
  }
  spdlog::debug("req={} lane={} prompt_tokens={} max_tokens={}", id, v.lane, v.submit.prompt_token_ids_size(),
                v.submit.sampling().max_tokens());
  return AdmittedRequest{std::move(v), std::move(*ticket), arrival};
}

void GenerationCall::Start(ferry::v1::GenerateRequest request) {
  auto admitted = Admit(request);
  if (auto* refused = std::get_if<Status>(&admitted)) {
    result_ = *refused;
    return End();
  }
  admitted_.emplace(std::move(std::get<AdmittedRequest>(admitted)));
  const ValidatedRequest& v = admitted_->v;
  lane_series_ = &context_.metrics.lane(v.lane);
  lane_series_->waiting.Increment();
  NewProgress();
  prefix_key_ = PrefixKey(v.submit.prompt_token_ids());
  cost_ = v.submit.prompt_token_ids_size() + v.submit.sampling().max_tokens();
  waiting_since_ = admitted_->arrival;
  deadline_ = hooks_.deadline;
  if (const int64_t ms = v.lane_rules.default_deadline_ms; ms > 0) {
    deadline_ = std::min(deadline_, std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
  }
  StartAttempt();
}

void GenerationCall::NewProgress() {
  const ValidatedRequest& v = admitted_->v;
  progress_.emplace(StreamProgress{CompletionText(context_.tokenizer, v.stop, v.submit.sampling().min_tokens(),
                                                  v.include_stop, v.skip_special_tokens)});
  progress_->final_chunk.set_request_id(v.submit.request_id());
  if (v.submit.sampling().has_prompt_logprobs()) progress_->first_prompt_token = v.submit.prompt_token_ids(0);
  held_.Clear();
}

// A replica that fails before the client was sent anything is left for another; after that, the
// failure is the request's (UNAVAILABLE), since what the client has cannot be taken back.
void GenerationCall::StartAttempt() {
  if (tried_.size() >= hooks_.max_attempts) return Conclude(last_attempt_status_);
  ReplicaRouter& router = context_.scheduler.router();
  replica_ = router.Choose(prefix_key_, tried_, admitted_->v.submit.lora_name());
  if (!replica_) return WaitForReplica();
  router.replica(*replica_).outstanding_tokens += cost_;
  attempt_started_ = false;
  attempt_ = context_.scheduler.NewStream(*replica_, admitted_->v.submit, deadline_, shared_from_this());
  if (hooks_.cancel != nullptr) hooks_.cancel->SetStream(attempt_);
  attempt_->Start();
}

void GenerationCall::WaitForReplica() {
  const auto delay = std::chrono::milliseconds(std::min<int64_t>(2000, int64_t{250} << std::min(replica_waits_, 3)));
  // A started request was admitted long ago: its lane's queue timeout no longer bounds it.
  const int64_t queue_ms = migrations_ == 0 ? admitted_->v.lane_rules.queue_timeout_ms : 0;
  const auto wait_limit = queue_ms > 0 ? std::chrono::milliseconds(queue_ms)
                                       : std::chrono::duration_cast<std::chrono::milliseconds>(kMaxReplicaWait);
  const bool in_time = Clock::now() + delay < waiting_since_ + wait_limit &&
                       std::chrono::system_clock::now() + delay < deadline_;
  // A caller allowing one attempt fails with its replica; a client that left is not waited for; and a replica
  // that answered UNAVAILABLE itself (draining, or its workers lost past their recovery timeout) is
  // up and has said its say: the request has waited there already.
  const bool refused = !tried_.empty() && last_attempt_status_.from_replica();
  if (hooks_.max_attempts <= 1 || !in_time || refused || hooks_.client_cancelled()) {
    if (refused) return Conclude(last_attempt_status_);
    Status status = tried_.empty() ? Status(StatusCode::kUnavailable, "no healthy scheduler replica")
                                   : last_attempt_status_;
    return Conclude(Status(StatusCode::kUnavailable,
                           fmt::format("no scheduler replica took the request within {} ms: {}", wait_limit.count(),
                                       status.error_message()))
                        .WithRetryAfter(1000));
  }
  if (replica_waits_++ == 0) {
    spdlog::info("req={} waits for a scheduler replica ({})", admitted_->v.submit.request_id(),
                 tried_.empty() ? "none is healthy" : last_attempt_status_.error_message());
  }
  tried_.clear();
  context_.scheduler.After(delay, [self = shared_from_this()] { self->StartAttempt(); });
}

void GenerationCall::OnEvent(const ferry::v1::TokenEvent& event) {
  StreamProgress& progress = *progress_;
  attempt_started_ = true;
  // The first event says the sequence left the scheduler's queue (it may carry no tokens).
  if (!progress.started) {
    progress.started = true;
    progress.queue_s = event.queue_s();
    progress.num_cached_tokens = event.num_cached_tokens();
    admitted_->ticket.Release();
    lane_series_->waiting.Decrement();
    lane_series_->running.Increment();
    lane_series_->queue_time.Observe(progress.queue_s);
  }
  if (event.token_ids_size() > 0) {
    const double now_s = Seconds(admitted_->arrival, Clock::now());
    if (progress.completion_tokens == 0) {
      progress.first_token_s = now_s;
      lane_series_->ttft.Observe(now_s);
    } else {
      lane_series_->inter_token.Observe(now_s - progress.last_token_s);
    }
    progress.last_token_s = now_s;
  }
  ferry::v1::GenerateChunk chunk = progress.Consume(event, context_.tokenizer);
  chunk.set_request_id(admitted_->v.submit.request_id());
  Prepend(held_, chunk);
  if (progress.reason != ferry::v1::FINISH_REASON_UNSPECIFIED) {
    progress.final_chunk = std::move(chunk);
    if (progress.text.stopped()) attempt_->Cancel();  // the scheduler frees the sequence
    return attempt_->StopReading();
  }
  if (chunk.token_ids_size() > 0 || !chunk.text().empty() || chunk.prompt_logprobs_size() > 0) {
    if (wrote_tokens_ && chunk.token_ids_size() < context_.options.stream_interval) {
      held_ = std::move(chunk);
      return attempt_->ReadNext();
    }
    wrote_tokens_ = wrote_tokens_ || chunk.token_ids_size() > 0;
    wrote_any_ = true;
    return hooks_.write(std::move(chunk));
  }
  attempt_->ReadNext();
}

void GenerationCall::WriteDone(bool ok) {
  if (final_written_) return End();
  if (ok) return attempt_->ReadNext();
  client_gone_ = true;
  attempt_->Cancel();
  attempt_->StopReading();
}

void GenerationCall::OnStreamDone(const Status& status) {
  if (hooks_.cancel != nullptr) hooks_.cancel->SetStream(nullptr);  // the stream is deleted after this
  attempt_ = nullptr;
  ReplicaRouter& router = context_.scheduler.router();
  auto& r = router.replica(*replica_);
  r.outstanding_tokens -= cost_;
  // A request the scheduler lost is not the client's failure. Lost while this attempt generated it,
  // after output: it migrates (a continuation, bounded by --migration-limit). Lost before this
  // attempt started it (the replica unreachable, or failing before its first event), or before any
  // output: it goes to another replica, or to this one once it is back, as it is: its prompt, or
  // the continuation it already is. Its seed is fixed at admission, so a run from the prompt sends
  // the tokens the lost attempt would have. Its lane place was given back when it first started.
  const bool ended = progress_->reason != ferry::v1::FINISH_REASON_UNSPECIFIED;  // its final event came
  if (ended || client_gone_ || status.error_code() != StatusCode::kUnavailable || hooks_.client_cancelled()) {
    if (progress_->started) router.Served(*replica_, prefix_key_);
    return Conclude(status);
  }
  if (attempt_started_ && HasOutput()) return Migrate(status);
  spdlog::warn("req={} scheduler {} unavailable before {} ({}); trying another", admitted_->v.submit.request_id(),
               r.address, HasOutput() ? "it resumed the request" : "any output", status.error_message());
  if (!HasOutput()) {
    if (progress_->started) {  // back to waiting, as it is
      lane_series_->running.Decrement();
      lane_series_->waiting.Increment();
    }
    NewProgress();
  }
  router.MarkUnhealthy(*replica_);
  tried_.push_back(*replica_);
  last_attempt_status_ = status;
  StartAttempt();
}

bool GenerationCall::HasOutput() const {
  return !progress_->token_ids.empty() || progress_->prompt_logprobs_seen > 0;
}

// The continuation is the request as admitted plus the tokens it has: the new scheduler computes
// them with the prompt and samples on from there, its seeded draw at their count, so the tokens
// after the seam are the ones the lost attempt would have sent. The progress is kept whole: the
// client's text (held-back stop-string prefixes, an incomplete UTF-8 character), min_tokens and
// usage go on across the seam, and what was read but not yet written is written as it would have
// been. Tokens the lost scheduler sent that were never read are not in token_ids: sampled again.
void GenerationCall::Migrate(const Status& status) {
  ReplicaRouter& router = context_.scheduler.router();
  const std::string& id = admitted_->v.submit.request_id();
  const std::string& address = router.replica(*replica_).address;
  router.MarkUnhealthy(*replica_);
  last_attempt_status_ = status;
  const int32_t limit = context_.options.migration_limit;
  if (migrations_ >= limit) {
    context_.metrics.migration_limit.Increment();
    spdlog::warn("req={} scheduler {} lost after {} tokens; not resumed: --migration-limit {} reached ({})", id,
                 address, progress_->token_ids.size(), limit, status.error_message());
    return Conclude(Status(StatusCode::kUnavailable,
                           fmt::format("scheduler {} lost mid-request after {} resumes (--migration-limit {}): {}",
                                       address, migrations_, limit, status.error_message()))
                        .WithRetryAfter(1000));
  }
  ++migrations_;
  context_.metrics.resumed.Increment();
  spdlog::warn("req={} scheduler {} lost after {} tokens ({}); resuming (migration {} of {})", id, address,
               progress_->token_ids.size(), status.error_message(), migrations_, limit);
  ferry::v1::SubmitRequest& submit = admitted_->v.submit;
  submit.mutable_generated_token_ids()->Assign(progress_->token_ids.begin(), progress_->token_ids.end());
  submit.set_queue_timeout_ms(0);  // it started long ago: its deadline alone bounds it now
  progress_->prompt_logprobs_to_skip = progress_->prompt_logprobs_seen;
  tried_.assign(1, *replica_);
  replica_waits_ = 0;
  waiting_since_ = Clock::now();
  StartAttempt();
}

void GenerationCall::Conclude(const Status& downstream) {
  StreamProgress& progress = *progress_;
  const std::string& id = admitted_->v.submit.request_id();
  (progress.started ? lane_series_->running : lane_series_->waiting).Decrement();
  Prepend(held_, progress.final_chunk);  // a deadline ends the call with what it has
  result_ = Outcome(hooks_.client_cancelled(), downstream, client_gone_, progress, admitted_->v.lane_rules);
  context_.metrics.requests.Add({{"lane", admitted_->v.lane}, {"code", StatusCodeName(result_.error_code())}})
      .Increment();
  const std::string& adapter = admitted_->v.submit.lora_name();
  if (!adapter.empty()) {
    context_.metrics.adapter_requests.Add({{"adapter", adapter}, {"code", StatusCodeName(result_.error_code())}})
        .Increment();
  }
  if (!result_.ok()) {
    spdlog::info("req={} ended: {} {}", id, static_cast<int>(result_.error_code()), result_.error_message());
    return End();
  }
  const int prompt_tokens = admitted_->v.submit.prompt_token_ids_size();
  auto& last = progress.final_chunk;
  last.set_finish_reason(progress.reason);
  last.mutable_usage()->set_prompt_tokens(prompt_tokens);
  last.mutable_usage()->set_completion_tokens(progress.completion_tokens);
  last.mutable_usage()->set_cached_tokens(progress.num_cached_tokens);
  const double total_s = Seconds(admitted_->arrival, Clock::now());
  // queue_s is the scheduler's own interval, inside this one: it starts when the scheduler took
  // the request (after this gateway's arrival) and ends when it was first scheduled (before its
  // first token left the scheduler), on the same machine-wide steady clock. So queue_s <=
  // first_token_s <= total_s as read; the tests assert it.
  last.mutable_timings()->set_queue_s(progress.queue_s);
  last.mutable_timings()->set_first_token_s(progress.first_token_s);
  last.mutable_timings()->set_total_s(total_s);
  LaneSeries& lane = *lane_series_;
  lane.e2e.Observe(total_s);
  if (progress.completion_tokens > 1) {
    lane.time_per_output_token.Observe((progress.last_token_s - progress.first_token_s) /
                                       (progress.completion_tokens - 1));
  }
  lane.prompt_tokens.Increment(prompt_tokens);
  lane.completion_tokens.Increment(progress.completion_tokens);
  if (!adapter.empty()) {
    context_.metrics.adapter_tokens.Add({{"adapter", adapter}, {"kind", "prompt"}}).Increment(prompt_tokens);
    context_.metrics.adapter_tokens.Add({{"adapter", adapter}, {"kind", "completion"}})
        .Increment(progress.completion_tokens);
  }
  if (auto it = lane.finished.find(progress.reason); it != lane.finished.end()) it->second->Increment();
  spdlog::debug("req={} finished: {} completion tokens in {:.3f}s ({})", id, progress.completion_tokens, total_s,
                ferry::v1::FinishReason_Name(progress.reason));
  // The client's answer to the final chunk (even "gone") ends the call: the request finished.
  final_written_ = true;
  hooks_.write(last);
}

void GenerationCall::End() {
  if (admitted_) admitted_->ticket.Release();
  // The hook may end the front, and with it this call: nothing of ours is touched after it.
  auto done = std::move(hooks_.done);
  Status status = std::move(result_);
  if (status.retry_after_ms() == 0) status.WithRetryAfter(retry_after_ms_);
  const int64_t retry_after_ms = status.retry_after_ms();
  done(std::move(status), retry_after_ms);
}

}  // namespace ferry::gateway
