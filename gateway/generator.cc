#include "gateway/generator.h"

#include <cctype>
#include <condition_variable>
#include <mutex>
#include <string_view>
#include <utility>

#include "gateway/gateway_metrics.h"

namespace ferry::gateway {

std::string StatusCodeName(StatusCode code) {
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

Generator::Generator(const tokenizer::Tokenizer& tokenizer, std::shared_ptr<SchedulerClient> scheduler,
                     GatewayOptions options, prometheus::Registry& registry)
    : tokenizer_(tokenizer),
      options_(std::move(options)),
      scheduler_(std::move(scheduler)),
      metrics_(std::make_unique<GatewayMetrics>(registry, options_.lanes)),
      queues_(options_.lanes),
      context_{tokenizer_, options_, *scheduler_, *metrics_, queues_} {}

Generator::~Generator() = default;

void Generator::CountRejection(const std::string& reason, const std::string& lane, StatusCode code) {
  metrics_->rejections.Add({{"reason", reason}}).Increment();
  metrics_->requests.Add({{"lane", LaneLabel(options_.lanes, lane)}, {"code", StatusCodeName(code)}}).Increment();
}

std::shared_ptr<GenerationCall> Generator::NewCall(CallHooks hooks) {
  return std::make_shared<GenerationCall>(context_, std::move(hooks));
}

Status Generator::Run(ferry::v1::GenerateRequest request, CallHooks hooks, const ChunkSink& sink,
                      int64_t* retry_after_ms) {
  // The call runs on the scheduler client's threads; this thread writes its chunks and waits for
  // its end. One chunk at a time: the call writes the next only after WriteDone.
  struct Mailbox {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<ferry::v1::GenerateChunk> chunk;
    std::optional<Status> status;
    int64_t retry_after_ms = 0;
  };
  auto box = std::make_shared<Mailbox>();
  hooks.write = [box](ferry::v1::GenerateChunk chunk) {
    std::lock_guard lock(box->mu);
    box->chunk = std::move(chunk);
    box->cv.notify_one();
  };
  hooks.done = [box](Status status, int64_t retry_after) {
    std::lock_guard lock(box->mu);
    box->status = std::move(status);
    box->retry_after_ms = retry_after;
    box->cv.notify_one();
  };
  auto call = NewCall(std::move(hooks));
  call->Start(std::move(request));
  std::unique_lock lock(box->mu);
  while (true) {
    box->cv.wait(lock, [&] { return box->chunk || box->status; });
    if (!box->chunk) break;
    ferry::v1::GenerateChunk chunk = *std::exchange(box->chunk, std::nullopt);
    lock.unlock();
    call->WriteDone(sink(chunk));
    lock.lock();
  }
  if (retry_after_ms != nullptr) *retry_after_ms = box->retry_after_ms;
  return *box->status;
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

}  // namespace ferry::gateway
