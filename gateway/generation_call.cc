#include "gateway/generation_call.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include <grpcpp/support/client_callback.h>
#include <spdlog/spdlog.h>

#include "gateway/gateway_metrics.h"

namespace ferry::gateway {

namespace {

using Clock = std::chrono::steady_clock;

// Clamped at 0: `from` and `to` may be read on different threads, and on this VM one core's clock
// read can lag another's by a few ms (CI saw a negative time to first token).
double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::max(0.0, std::chrono::duration<double>(to - from).count());
}

}  // namespace

// One scheduler Submit stream. Owns itself (deleted in OnDone) and keeps its call alive until
// then. A hold keeps OnDone back until the call stops reading, since reads also start from
// WriteDone, outside this reactor's reactions.
class GenerationCall::Attempt final : public grpc::ClientReadReactor<ferry::v1::TokenEvent> {
 public:
  Attempt(std::shared_ptr<GenerationCall> call, grpc::ClientContext* context)
      : call_(std::move(call)), context_(context) {}

  void Begin(ferry::v1::Scheduler::Stub& stub, const ferry::v1::SubmitRequest& submit) {
    stub.async()->Submit(context_, &submit, this);
    AddHold();
    StartRead(&event_);
    StartCall();  // the last touch: callbacks may run from here on
  }
  void ReadNext() {
    event_.Clear();
    StartRead(&event_);
  }
  // No further read; OnDone follows once the stream's status is in. The caller's last touch.
  void StopReading() { RemoveHold(); }
  void Cancel() { context_->TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return StopReading();
    call_->OnEvent(event_);
  }
  void OnDone(const grpc::Status& status) override {
    std::shared_ptr<GenerationCall> call = std::move(call_);
    const grpc::Status result = status;
    delete this;
    call->OnAttemptDone(result);
  }

 private:
  std::shared_ptr<GenerationCall> call_;
  grpc::ClientContext* context_;  // the front's; outlives the stream
  ferry::v1::TokenEvent event_;
};

GenerationCall::GenerationCall(Generator& generator, CallHooks hooks)
    : generator_(generator), hooks_(std::move(hooks)) {}

GenerationCall::~GenerationCall() = default;

void GenerationCall::Start(ferry::v1::GenerateRequest request) {
  auto admitted = generator_.Admit(request, retry_after_ms_);
  if (auto* refused = std::get_if<grpc::Status>(&admitted)) {
    result_ = *refused;
    return End();
  }
  admitted_.emplace(std::move(std::get<AdmittedRequest>(admitted)));
  const ValidatedRequest& v = admitted_->v;
  lane_series_ = &generator_.metrics_->lane(v.lane);
  lane_series_->waiting.Increment();
  progress_.emplace(StreamProgress{CompletionText(generator_.tokenizer_, v.stop, v.submit.sampling().min_tokens(), v.include_stop)});
  progress_->final_chunk.set_request_id(v.submit.request_id());
  if (v.submit.sampling().has_prompt_logprobs()) progress_->first_prompt_token = v.submit.prompt_token_ids(0);
  prefix_key_ = PrefixKey(v.submit.prompt_token_ids());
  cost_ = v.submit.prompt_token_ids_size() + v.submit.sampling().max_tokens();
  StartAttempt();
}

// A replica that fails before the request started is left for another; after the start, the
// failure is the request's (UNAVAILABLE), since its tokens so far cannot be taken back.
void GenerationCall::StartAttempt() {
  grpc::ClientContext* downstream = hooks_.make_context();
  if (downstream == nullptr) return Conclude(last_attempt_status_);
  ReplicaRouter& router = *generator_.router_;
  replica_ = router.Choose(prefix_key_, tried_);
  if (!replica_) return Conclude(grpc::Status(grpc::StatusCode::UNAVAILABLE, "no healthy scheduler replica"));
  Generator::ApplyLaneDeadline(admitted_->v.lane_rules, *downstream);
  auto& r = router.replica(*replica_);
  r.outstanding_tokens += cost_;
  attempt_ = new Attempt(shared_from_this(), downstream);
  attempt_->Begin(*r.stub, admitted_->v.submit);
}

void GenerationCall::OnEvent(const ferry::v1::TokenEvent& event) {
  StreamProgress& progress = *progress_;
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
  ferry::v1::GenerateChunk chunk = progress.Consume(event, generator_.tokenizer_);
  chunk.set_request_id(admitted_->v.submit.request_id());
  if (progress.reason != ferry::v1::FINISH_REASON_UNSPECIFIED) {
    progress.final_chunk = std::move(chunk);
    if (progress.text.stopped()) attempt_->Cancel();  // the scheduler frees the sequence
    return attempt_->StopReading();
  }
  if (chunk.token_ids_size() > 0 || !chunk.text().empty() || chunk.prompt_logprobs_size() > 0) {
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

void GenerationCall::OnAttemptDone(const grpc::Status& status) {
  attempt_ = nullptr;
  ReplicaRouter& router = *generator_.router_;
  auto& r = router.replica(*replica_);
  r.outstanding_tokens -= cost_;
  if (progress_->started || status.error_code() != grpc::StatusCode::UNAVAILABLE || hooks_.client_cancelled()) {
    if (progress_->started) router.Served(*replica_, prefix_key_);
    return Conclude(status);
  }
  spdlog::warn("req={} scheduler {} unavailable before the start ({}); trying another",
               admitted_->v.submit.request_id(), r.address, status.error_message());
  router.MarkUnhealthy(*replica_);
  tried_.push_back(*replica_);
  last_attempt_status_ = status;
  StartAttempt();
}

void GenerationCall::Conclude(const grpc::Status& downstream) {
  StreamProgress& progress = *progress_;
  const std::string& id = admitted_->v.submit.request_id();
  (progress.started ? lane_series_->running : lane_series_->waiting).Decrement();
  result_ = Generator::Conclude(hooks_.client_cancelled(), downstream, client_gone_, progress);
  generator_.metrics_->requests.Add({{"lane", admitted_->v.lane}, {"code", StatusCodeName(result_.error_code())}})
      .Increment();
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
  // queue_s is the scheduler's own measure (its clock reads on two threads can disagree by a
  // few ms on this VM); the queue is part of the wait for the first token, so never longer.
  const double queue_s =
      progress.completion_tokens > 0 ? std::min(progress.queue_s, progress.first_token_s) : progress.queue_s;
  last.mutable_timings()->set_queue_s(queue_s);
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
  grpc::Status status = std::move(result_);
  done(std::move(status), retry_after_ms_);
}

}  // namespace ferry::gateway
