#include "gateway/generator.h"

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <string_view>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/metrics.h"
#include "gateway/completion_text.h"
#include "gateway/gateway_metrics.h"
#include "gateway/generation_call.h"

namespace ferry::gateway {

namespace {

using Clock = std::chrono::steady_clock;
using ferry::v1::FinishReason;

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

}  // namespace

std::string StatusCodeName(grpc::StatusCode code) {
  static const char* kNames[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
                                 "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
                                 "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  return i >= 0 && i < 17 ? kNames[i] : "UNKNOWN";
}

std::string FinishReasonLabel(ferry::v1::FinishReason reason) {
  std::string name = ferry::v1::FinishReason_Name(reason);
  name.erase(0, std::string_view("FINISH_REASON_").size());
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

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
  metrics_->requests.Add({{"lane", ResolveLane(lane).value_or("unknown")}, {"code", StatusCodeName(code)}}).Increment();
}

std::variant<grpc::Status, AdmittedRequest> Generator::Admit(ferry::v1::GenerateRequest& request,
                                                            int64_t& retry_after_ms) {
  const auto arrival = Clock::now();
  if (request.request_id().empty()) request.set_request_id(NewRequestId());
  // A bad id is refused below; it is not written to the log.
  const std::string id = CheckRequestId(request.request_id()).empty() ? request.request_id() : "(invalid id)";
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
  if (v.submit.sampling().seed() == 0) v.submit.mutable_sampling()->set_seed(RandomU64() | 1);
  // A full lane answers at once; the ticket holds the place until the request starts.
  auto ticket = queues_.TryEnter(v.lane_rules);
  if (!ticket) {
    const int64_t hint = std::max<int64_t>(100, v.lane_rules.queue_timeout_ms / 10);
    retry_after_ms = hint;
    metrics_->lane_full.Increment();
    metrics_->requests.Add({{"lane", v.lane}, {"code", "RESOURCE_EXHAUSTED"}}).Increment();
    spdlog::info("req={} lane {} full ({} queued)", id, v.lane, v.lane_rules.max_queued);
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        fmt::format("lane \"{}\" is full ({} requests waiting); retry after {} ms", v.lane,
                                    v.lane_rules.max_queued, hint));
  }
  spdlog::debug("req={} lane={} prompt_tokens={} max_tokens={}", id, v.lane, v.submit.prompt_token_ids_size(),
                v.submit.sampling().max_tokens());
  return AdmittedRequest{std::move(v), std::move(*ticket), arrival};
}

std::shared_ptr<GenerationCall> Generator::NewCall(CallHooks hooks) {
  return std::make_shared<GenerationCall>(*this, std::move(hooks));
}

grpc::Status Generator::Run(ferry::v1::GenerateRequest request, const ContextFactory& make_context,
                            const std::function<bool()>& client_cancelled, const ChunkSink& sink,
                            int64_t* retry_after_ms) {
  // The call runs on gRPC's threads; this thread writes its chunks and waits for its end.
  struct Mailbox {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<ferry::v1::GenerateChunk> chunks;
    std::optional<grpc::Status> status;
    int64_t retry_after_ms = 0;
  };
  auto box = std::make_shared<Mailbox>();
  CallHooks hooks;
  hooks.make_context = make_context;
  hooks.client_cancelled = client_cancelled;
  hooks.write = [box](ferry::v1::GenerateChunk chunk) {
    {
      std::lock_guard lock(box->mu);
      box->chunks.push_back(std::move(chunk));
    }
    box->cv.notify_one();
  };
  hooks.done = [box](grpc::Status status, int64_t retry_after) {
    {
      std::lock_guard lock(box->mu);
      box->status = std::move(status);
      box->retry_after_ms = retry_after;
    }
    box->cv.notify_one();
  };
  auto call = NewCall(std::move(hooks));
  call->Start(std::move(request));
  std::unique_lock lock(box->mu);
  while (true) {
    box->cv.wait(lock, [&] { return !box->chunks.empty() || box->status.has_value(); });
    if (box->chunks.empty()) break;
    ferry::v1::GenerateChunk chunk = std::move(box->chunks.front());
    box->chunks.pop_front();
    lock.unlock();
    call->WriteDone(sink(chunk));
    lock.lock();
  }
  if (retry_after_ms != nullptr) *retry_after_ms = box->retry_after_ms;
  return *box->status;
}

grpc::Status Generator::Run(ferry::v1::GenerateRequest request, grpc::ClientContext& downstream,
                            const std::function<bool()>& client_cancelled, const ChunkSink& sink,
                            int64_t* retry_after_ms) {
  bool used = false;  // one context, so one attempt
  auto once = [&]() -> grpc::ClientContext* { return std::exchange(used, true) ? nullptr : &downstream; };
  return Run(std::move(request), once, client_cancelled, sink, retry_after_ms);
}

void Generator::ApplyLaneDeadline(const Lane& lane, grpc::ClientContext& downstream) {
  if (lane.default_deadline_ms <= 0) return;
  const auto lane_deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(lane.default_deadline_ms);
  if (lane_deadline < downstream.deadline()) downstream.set_deadline(lane_deadline);
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
  response.mutable_prompt_logprobs()->MergeFrom(chunk.prompt_logprobs());
  if (chunk.finish_reason() != ferry::v1::FINISH_REASON_UNSPECIFIED) {
    response.set_finish_reason(chunk.finish_reason());
    *response.mutable_usage() = chunk.usage();
    *response.mutable_timings() = chunk.timings();
  }
}

namespace {

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
    AddDecoded(lp, lp.token_id(), tokenizer, chunk.add_prompt_logprobs());
  }
  for (int i = 0; i < event.token_ids_size(); ++i) {
    const int32_t token = event.token_ids(i);
    chunk.add_token_ids(token);
    if (i < event.logprobs_size()) AddDecoded(event.logprobs(i), token, tokenizer, chunk.add_logprobs());
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
