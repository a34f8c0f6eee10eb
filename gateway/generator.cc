#include "gateway/generator.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <map>
#include <random>
#include <string_view>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/metrics.h"
#include "gateway/completion_text.h"

namespace ferry::gateway {

namespace {

using Clock = std::chrono::steady_clock;
using ferry::v1::FinishReason;

// Clamped at 0: `from` and `to` may be read on different threads, and on this VM one core's clock
// read can lag another's by a few ms (CI saw a negative time to first token).
double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::max(0.0, std::chrono::duration<double>(to - from).count());
}

uint64_t RandomU64() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

std::string StatusName(grpc::StatusCode code) {
  static const char* kNames[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
                                 "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
                                 "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  return i >= 0 && i < 17 ? kNames[i] : "UNKNOWN";
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

// "length", "eos", ...: the enum name without its prefix, in lower case.
std::string FinishReasonLabel(ferry::v1::FinishReason reason) {
  std::string name = ferry::v1::FinishReason_Name(reason);
  name.erase(0, std::string_view("FINISH_REASON_").size());
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

}  // namespace

// One lane's series, made when the Generator starts so that every lane shows (at 0) before
// its first request and the hot path never looks labels up.
struct LaneSeries {
  prometheus::Gauge& waiting;  // submitted, not yet scheduled
  prometheus::Gauge& running;  // scheduled, generating
  prometheus::Histogram& ttft;
  prometheus::Histogram& e2e;
  prometheus::Histogram& queue_time;
  prometheus::Histogram& inter_token;
  prometheus::Histogram& time_per_output_token;
  prometheus::Counter& prompt_tokens;
  prometheus::Counter& completion_tokens;
  std::map<ferry::v1::FinishReason, prometheus::Counter*> finished;
};

struct GatewayMetrics {
  GatewayMetrics(prometheus::Registry& r, const LaneTable& lanes)
      : requests(prometheus::BuildCounter().Name("ferry_gateway_requests_total")
                     .Help("Requests answered, by lane and gRPC status code").Register(r)),
        rejections(prometheus::BuildCounter().Name("ferry_gateway_rejections_total")
                       .Help("Requests refused before reaching the scheduler, by reason").Register(r)),
        invalid(rejections.Add({{"reason", "invalid"}})),
        lane_full(rejections.Add({{"reason", "lane_full"}})),
        auth_refused(rejections.Add({{"reason", "auth"}})),
        rate_limited(rejections.Add({{"reason", "rate_limit"}})),
        ttft(prometheus::BuildHistogram().Name("ferry_gateway_time_to_first_token_seconds")
                 .Help("Arrival to first token, by lane").Register(r)),
        e2e(prometheus::BuildHistogram().Name("ferry_gateway_request_duration_seconds")
                .Help("Arrival to last token of requests that finished, by lane").Register(r)),
        queue_time(prometheus::BuildHistogram().Name("ferry_gateway_queue_time_seconds")
                       .Help("Time waiting in the scheduler's queue before the first step, by lane").Register(r)),
        inter_token(prometheus::BuildHistogram().Name("ferry_gateway_inter_token_latency_seconds")
                        .Help("Time between successive token deliveries of one request, by lane").Register(r)),
        time_per_output_token(prometheus::BuildHistogram().Name("ferry_gateway_time_per_output_token_seconds")
                                  .Help("(last token - first token) / (completion tokens - 1) per request, by lane")
                                  .Register(r)),
        tokens(prometheus::BuildCounter().Name("ferry_gateway_tokens_total")
                   .Help("Prompt and completion tokens of answered requests, by lane").Register(r)),
        finished(prometheus::BuildCounter().Name("ferry_gateway_requests_finished_total")
                     .Help("Requests that ended with a finish reason, by lane and reason").Register(r)),
        in_flight(prometheus::BuildGauge().Name("ferry_gateway_requests_in_flight")
                      .Help("Requests being served, by lane and state (waiting: not yet scheduled)").Register(r)) {
    for (const Lane& lane : lanes.lanes()) AddLane(lane.name);
  }

  LaneSeries& lane(const std::string& name) { return by_lane.at(name); }

  prometheus::Family<prometheus::Counter>& requests;
  prometheus::Family<prometheus::Counter>& rejections;
  prometheus::Counter& invalid;
  prometheus::Counter& lane_full;
  prometheus::Counter& auth_refused;
  prometheus::Counter& rate_limited;
  prometheus::Family<prometheus::Histogram>& ttft;
  prometheus::Family<prometheus::Histogram>& e2e;
  prometheus::Family<prometheus::Histogram>& queue_time;
  prometheus::Family<prometheus::Histogram>& inter_token;
  prometheus::Family<prometheus::Histogram>& time_per_output_token;
  prometheus::Family<prometheus::Counter>& tokens;
  prometheus::Family<prometheus::Counter>& finished;
  prometheus::Family<prometheus::Gauge>& in_flight;
  std::map<std::string, LaneSeries> by_lane;  // filled once, read-only afterwards

 private:
  void AddLane(const std::string& name) {
    const prometheus::Labels lane{{"lane", name}};
    const auto buckets = LatencyBucketsSeconds();
    LaneSeries series{in_flight.Add({{"lane", name}, {"state", "waiting"}}),
                      in_flight.Add({{"lane", name}, {"state", "running"}}),
                      ttft.Add(lane, buckets),
                      e2e.Add(lane, buckets),
                      queue_time.Add(lane, buckets),
                      inter_token.Add(lane, buckets),
                      time_per_output_token.Add(lane, buckets),
                      tokens.Add({{"lane", name}, {"kind", "prompt"}}),
                      tokens.Add({{"lane", name}, {"kind", "completion"}}),
                      {}};
    for (auto reason : {ferry::v1::FINISH_REASON_STOP, ferry::v1::FINISH_REASON_LENGTH, ferry::v1::FINISH_REASON_EOS,
                        ferry::v1::FINISH_REASON_TIMEOUT}) {
      series.finished[reason] = &finished.Add({{"lane", name}, {"reason", FinishReasonLabel(reason)}});
    }
    by_lane.emplace(name, std::move(series));
  }
};

Generator::Generator(const tokenizer::Tokenizer& tokenizer, std::shared_ptr<ReplicaRouter> router,
                     GatewayOptions options, prometheus::Registry& registry)
    : tokenizer_(tokenizer),
      router_(std::move(router)),
      options_(std::move(options)),
      metrics_(std::make_unique<GatewayMetrics>(registry, options_.lanes)),
      queues_(options_.lanes) {}

Generator::Generator(const tokenizer::Tokenizer& tokenizer, std::shared_ptr<grpc::Channel> scheduler,
                     GatewayOptions options, prometheus::Registry& registry)
    : Generator(tokenizer,
                std::make_shared<ReplicaRouter>(std::vector<std::shared_ptr<grpc::Channel>>{std::move(scheduler)},
                                                std::vector<std::string>{"scheduler"}),
                std::move(options), registry) {}

Generator::~Generator() = default;

void Generator::CountRejection(const std::string& reason, const std::string& lane, grpc::StatusCode code) {
  metrics_->rejections.Add({{"reason", reason}}).Increment();
  metrics_->requests.Add({{"lane", ResolveLane(lane).value_or("unknown")}, {"code", StatusName(code)}}).Increment();
}

grpc::Status Generator::Run(ferry::v1::GenerateRequest request, const ContextFactory& make_context,
                            const std::function<bool()>& client_cancelled, const ChunkSink& sink,
                            int64_t* retry_after_ms) {
  const auto arrival = Clock::now();
  if (request.request_id().empty()) request.set_request_id(NewRequestId());
  const std::string id = request.request_id();
  auto validated = ValidateRequest(request, options_.limits, options_.lanes, tokenizer_);
  if (auto* error = std::get_if<ValidationError>(&validated)) {
    spdlog::info("req={} invalid: {}", id, error->message);
    metrics_->invalid.Increment();
    // Only configured lane names become label values: a client cannot grow the series.
    metrics_->requests.Add({{"lane", ResolveLane(request.lane()).value_or("unknown")}, {"code", "INVALID_ARGUMENT"}})
        .Increment();
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, error->message);
  }
  ValidatedRequest& v = std::get<ValidatedRequest>(validated);
  v.submit.set_request_id(id);
  if (v.submit.seed() == 0) v.submit.set_seed(RandomU64() | 1);
  // A full lane answers at once; the ticket holds the place until the request starts.
  auto ticket = queues_.TryEnter(v.lane_rules);
  if (!ticket) {
    const int64_t hint = std::max<int64_t>(100, v.lane_rules.queue_timeout_ms / 10);
    if (retry_after_ms) *retry_after_ms = hint;
    metrics_->lane_full.Increment();
    metrics_->requests.Add({{"lane", v.lane}, {"code", "RESOURCE_EXHAUSTED"}}).Increment();
    spdlog::info("req={} lane {} full ({} queued)", id, v.lane, v.lane_rules.max_queued);
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        fmt::format("lane \"{}\" is full ({} requests waiting); retry after {} ms", v.lane,
                                    v.lane_rules.max_queued, hint));
  }
  const int prompt_tokens = v.submit.prompt_token_ids_size();
  spdlog::debug("req={} lane={} prompt_tokens={} max_tokens={}", id, v.lane, prompt_tokens, v.submit.max_tokens());
  LaneSeries& lane_series = metrics_->lane(v.lane);
  lane_series.waiting.Increment();

  StreamProgress progress{CompletionText(tokenizer_, v.stop)};
  progress.final_chunk.set_request_id(id);
  bool client_gone = false;
  grpc::Status status;
  const uint64_t prefix_key = PrefixKey(v.submit.prompt_token_ids());
  const int64_t cost = prompt_tokens + v.submit.max_tokens();
  std::vector<size_t> tried;
  // A replica that fails before the request started is left for another; after the start, the
  // failure is the request's (UNAVAILABLE), since its tokens so far cannot be taken back.
  for (grpc::ClientContext* downstream = make_context(); downstream != nullptr; downstream = make_context()) {
    const auto replica = router_->Choose(prefix_key, tried);
    if (!replica) {
      status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "no healthy scheduler replica");
      break;
    }
    ApplyLaneDeadline(v.lane_rules, *downstream);
    auto& r = router_->replica(*replica);
    r.outstanding_tokens += cost;
    status = Stream(*r.stub, *downstream, v, arrival, sink, *ticket, progress, client_gone);
    r.outstanding_tokens -= cost;
    if (progress.started || status.error_code() != grpc::StatusCode::UNAVAILABLE || client_cancelled()) {
      if (progress.started) router_->Served(*replica, prefix_key);
      break;
    }
    spdlog::warn("req={} scheduler {} unavailable before the start ({}); trying another", id, r.address,
                 status.error_message());
    router_->MarkUnhealthy(*replica);
    tried.push_back(*replica);
  }
  (progress.started ? lane_series.running : lane_series.waiting).Decrement();
  grpc::Status result = Conclude(client_cancelled(), status, client_gone, progress);
  if (result.ok()) {
    auto& last = progress.final_chunk;
    last.set_finish_reason(progress.reason);
    last.mutable_usage()->set_prompt_tokens(prompt_tokens);
    last.mutable_usage()->set_completion_tokens(progress.completion_tokens);
    const double total_s = Seconds(arrival, Clock::now());
    // queue_s is the scheduler's own measure (its clock reads on two threads can disagree by a
    // few ms on this VM); the queue is part of the wait for the first token, so never longer.
    last.mutable_timings()->set_queue_s(progress.completion_tokens > 0 ? std::min(progress.queue_s, progress.first_token_s)
                                                                       : progress.queue_s);
    last.mutable_timings()->set_first_token_s(progress.first_token_s);
    last.mutable_timings()->set_total_s(total_s);
    sink(last);
    lane_series.e2e.Observe(total_s);
    if (progress.completion_tokens > 1) {
      lane_series.time_per_output_token.Observe((progress.last_token_s - progress.first_token_s) /
                                                (progress.completion_tokens - 1));
    }
    lane_series.prompt_tokens.Increment(prompt_tokens);
    lane_series.completion_tokens.Increment(progress.completion_tokens);
    if (auto it = lane_series.finished.find(progress.reason); it != lane_series.finished.end()) it->second->Increment();
    spdlog::debug("req={} finished: {} completion tokens in {:.3f}s ({})", id, progress.completion_tokens,
                  total_s, ferry::v1::FinishReason_Name(progress.reason));
  } else {
    spdlog::info("req={} ended: {} {}", id, static_cast<int>(result.error_code()), result.error_message());
  }
  metrics_->requests.Add({{"lane", v.lane}, {"code", StatusName(result.error_code())}}).Increment();
  return result;
}

grpc::Status Generator::Run(ferry::v1::GenerateRequest request, grpc::ClientContext& downstream,
                            const std::function<bool()>& client_cancelled, const ChunkSink& sink,
                            int64_t* retry_after_ms) {
  bool used = false;  // one context, so one attempt
  return Run(std::move(request), [&]() -> grpc::ClientContext* { return std::exchange(used, true) ? nullptr : &downstream; },
             client_cancelled, sink, retry_after_ms);
}

void Generator::ApplyLaneDeadline(const Lane& lane, grpc::ClientContext& downstream) {
  if (lane.default_deadline_ms <= 0) return;
  const auto lane_deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(lane.default_deadline_ms);
  if (lane_deadline < downstream.deadline()) downstream.set_deadline(lane_deadline);
}

// One scheduler call: reads its events into progress and chunks until the end or the client
// leaves. Returns the call's status.
grpc::Status Generator::Stream(ferry::v1::Scheduler::Stub& stub, grpc::ClientContext& downstream,
                               const ValidatedRequest& v, Clock::time_point arrival, const ChunkSink& sink,
                               LaneQueues::Ticket& ticket, StreamProgress& progress, bool& client_gone) {
  auto reader = stub.Submit(&downstream, v.submit);
  LaneSeries& lane_series = metrics_->lane(v.lane);
  ferry::v1::TokenEvent event;
  while (reader->Read(&event)) {
    // The first event says the sequence left the scheduler's queue (it may carry no tokens).
    if (!progress.started) {
      progress.started = true;
      progress.queue_s = event.queue_s();
      ticket.Release();
      lane_series.waiting.Decrement();
      lane_series.running.Increment();
      lane_series.queue_time.Observe(progress.queue_s);
    }
    if (event.token_ids_size() > 0) {
      const double now_s = Seconds(arrival, Clock::now());
      if (progress.completion_tokens == 0) {
        progress.first_token_s = now_s;
        lane_series.ttft.Observe(now_s);
      } else {
        lane_series.inter_token.Observe(now_s - progress.last_token_s);
      }
      progress.last_token_s = now_s;
    }
    ferry::v1::GenerateChunk chunk = progress.Consume(event, tokenizer_);
    chunk.set_request_id(v.submit.request_id());
    if (progress.reason != ferry::v1::FINISH_REASON_UNSPECIFIED) {
      progress.final_chunk = std::move(chunk);
      if (progress.text.stopped()) downstream.TryCancel();  // the scheduler frees the sequence
      break;
    }
    if ((chunk.token_ids_size() > 0 || !chunk.text().empty()) && !sink(chunk)) {
      client_gone = true;
      downstream.TryCancel();
      break;
    }
    event.Clear();
  }
  return reader->Finish();
}

grpc::Status Generator::Conclude(bool client_cancelled, const grpc::Status& downstream, bool client_gone,
                                 StreamProgress& progress) {
  if (client_gone) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
  if (progress.reason != ferry::v1::FINISH_REASON_UNSPECIFIED) return grpc::Status::OK;
  // The scheduler call ended without a finish: deadline, cancellation or failure.
  if (downstream.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    progress.reason = ferry::v1::FINISH_REASON_TIMEOUT;
    progress.final_chunk.mutable_text()->append(progress.text.Finish());
    return grpc::Status::OK;
  }
  if (client_cancelled) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
  if (downstream.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, "scheduler ended the stream without a finish");
  const auto code = downstream.error_code() == grpc::StatusCode::ABORTED ? grpc::StatusCode::INTERNAL
                                                                          : downstream.error_code();
  return grpc::Status(code, "scheduler: " + downstream.error_message());
}

void AppendChunk(const ferry::v1::GenerateChunk& chunk, ferry::v1::GenerateResponse& response) {
  response.set_request_id(chunk.request_id());
  response.mutable_text()->append(chunk.text());
  response.mutable_token_ids()->Add(chunk.token_ids().begin(), chunk.token_ids().end());
  response.mutable_logprobs()->MergeFrom(chunk.logprobs());
  if (chunk.finish_reason() != ferry::v1::FINISH_REASON_UNSPECIFIED) {
    response.set_finish_reason(chunk.finish_reason());
    *response.mutable_usage() = chunk.usage();
    *response.mutable_timings() = chunk.timings();
  }
}

ferry::v1::GenerateChunk StreamProgress::Consume(const ferry::v1::TokenEvent& event,
                                                const tokenizer::Tokenizer& tokenizer) {
  ferry::v1::GenerateChunk chunk;
  for (int i = 0; i < event.token_ids_size(); ++i) {
    const int32_t token = event.token_ids(i);
    chunk.add_token_ids(token);
    if (i < event.logprobs_size()) {
      // The token's own text, as OpenAI's logprobs show it.
      auto* lp = chunk.add_logprobs();
      *lp = event.logprobs(i);
      lp->set_token(tokenizer.Decode(std::span<const int32_t>(&token, 1)));
      for (auto& top : *lp->mutable_top()) {
        const int32_t id = top.token_id();
        top.set_token(tokenizer.Decode(std::span<const int32_t>(&id, 1)));
      }
    }
    ++completion_tokens;
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

}  // namespace ferry::gateway
