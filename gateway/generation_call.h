// One request's life in the gateway, driven by callbacks (no thread waits on it): validate and
// tokenise it, admit it into its lane, submit it to a scheduler replica, turn the scheduler's
// token stream into text chunks (incremental detokenisation, stop strings, logprobs) and end it
// with usage, timings and a status. Every front (gRPC, OpenAI HTTP, jobs) runs its requests as
// calls; generator.h makes them and holds what they share.
//
// Flow: Start validates and admits the request on the caller's thread, then opens a scheduler
// Submit stream (scheduler_client.h; one per attempt). Each event is folded into a chunk and
// handed to the front's `write` hook; the next event is read only after the front answers with
// WriteDone, so the client's pace is the stream's flow control. When the stream ends: a replica
// that failed (UNAVAILABLE) before the request had output is left for another attempt; one lost
// after it migrates the request (a continuation of the tokens it has, up to --migration-limit);
// otherwise the call concludes, writes the final chunk (finish reason, usage, timings) and calls
// `done`.
//
// Threads: hooks run on the scheduler client's threads (Start's refusals on the caller's), never
// two at once for one call.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <variant>
#include <vector>

#include "ferry/v1/generation.pb.h"
#include "gateway/completion_text.h"
#include "gateway/lanes.h"
#include "gateway/request_validation.h"
#include "gateway/scheduler_client.h"
#include "gateway/status.h"
#include "gateway/tokenizer/tokenizer.h"

namespace ferry::gateway {

struct GatewayMetrics;
struct LaneSeries;

// Scheduler attempts one request may make: a replica that fails before the client was sent
// anything is left for another, up to this many in all.
inline constexpr size_t kMaxSchedulerAttempts = 4;
// Times one started request may move to another scheduler (or to its own, restarted) when the one
// generating it is lost (--migration-limit, NVIDIA Dynamo's name).
inline constexpr int32_t kDefaultMigrationLimit = 3;
// The longest a request waits for a replica to take it when its lane sets no queue timeout.
inline constexpr auto kMaxReplicaWait = std::chrono::seconds(30);

struct GatewayOptions {
  ModelLimits limits;
  LaneTable lanes = LaneTable::Defaults();
  // Tokens a streamed chunk waits for before it is written (--stream-interval): the first tokens go
  // at once (time to first token), the last with the finish. 1: whatever each step brought.
  int32_t stream_interval = 1;
  // A started request whose scheduler is lost resumes elsewhere this many times at most (each
  // loss one migration); past it the request ends UNAVAILABLE with a retry hint. 0: never.
  int32_t migration_limit = kDefaultMigrationLimit;
};

// What the calls of one Generator share (it owns them).
struct GenerationContext {
  const tokenizer::Tokenizer& tokenizer;
  const GatewayOptions& options;
  SchedulerClient& scheduler;
  GatewayMetrics& metrics;
  LaneQueues& queues;
};

// What one request has produced so far.
struct StreamProgress {
  CompletionText text;
  ferry::v1::GenerateChunk final_chunk;  // sent last, with finish reason, usage and timings
  ferry::v1::FinishReason reason = ferry::v1::FINISH_REASON_UNSPECIFIED;
  int completion_tokens = 0;
  // Every token the scheduler sent, written to the client or not: what a resume continues after.
  std::vector<int32_t> token_ids;
  // Prompt logprobs taken so far; after a resume the new scheduler sends them again from the
  // start, and the first `prompt_logprobs_to_skip` of its are dropped (each is sent once).
  int32_t prompt_logprobs_seen = 0;
  int32_t prompt_logprobs_to_skip = 0;
  bool started = false;  // the scheduler has scheduled the sequence
  double queue_s = 0;
  int32_t num_cached_tokens = 0;  // prompt tokens the scheduler found in its prefix cache
  double first_token_s = 0;
  double last_token_s = 0;  // since arrival, of the latest event that carried tokens
  // prompt_logprobs: the first prompt token, sent (without a logprob) ahead of the others in
  // the first chunk; -1 when not requested or already sent.
  int32_t first_prompt_token = -1;
  // Folds one scheduler event into a chunk; sets reason when it ends the request.
  ferry::v1::GenerateChunk Consume(const ferry::v1::TokenEvent& event, const tokenizer::Tokenizer& tokenizer);
};

// A request that passed validation and holds a place in its lane.
struct AdmittedRequest {
  ValidatedRequest v;
  LaneQueues::Ticket ticket;  // released when the scheduler starts it (or it ends)
  std::chrono::steady_clock::time_point arrival;
};

// A front's way to cancel a request from any thread (its client went away, a sibling choice
// failed, the job was cancelled): the scheduler stream open now ends, and any opened later ends
// at once. The front keeps it until the call's `done`; a front that runs one request as several
// calls (jobs, while the lane is full) gives each the same one.
class CancelSource {
 public:
  void Cancel();
  // The call's open stream (nullptr once it has ended).
  void SetStream(SchedulerStream* stream);

 private:
  std::mutex mu_;
  bool is_cancelled_ = false;
  SchedulerStream* stream_ = nullptr;
};

struct CallHooks {
  // The front's deadline (the client's); a lane's default deadline, when shorter, wins.
  std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max();
  size_t max_attempts = kMaxSchedulerAttempts;
  CancelSource* cancel = nullptr;  // null: the front never cancels
  // Whether the client gave up (read when a scheduler stream ends).
  std::function<bool()> client_cancelled;
  // A chunk for the client. The front answers with GenerationCall::WriteDone(ok) once the
  // client took it (ok = false: the client is gone).
  std::function<void(ferry::v1::GenerateChunk)> write;
  // The end, once: after the last chunk's WriteDone, or without any chunk when the request was
  // refused or failed. retry_after_ms > 0 when a full lane suggests a retry. The call touches
  // nothing of its own after this hook returns.
  std::function<void(Status, int64_t retry_after_ms)> done;
};

class GenerationCall final : public StreamReader, public std::enable_shared_from_this<GenerationCall> {
 public:
  GenerationCall(GenerationContext& context, CallHooks hooks);
  ~GenerationCall() override;

  // Validates, admits and opens the first scheduler stream; `done` may run before it returns.
  void Start(ferry::v1::GenerateRequest request);
  // The front's answer to each `write`.
  void WriteDone(bool ok);

 private:
  // Validates, tokenises and enters the request's lane; a status when it is refused (counted),
  // with a retry hint in retry_after_ms_ when the lane is full.
  std::variant<Status, AdmittedRequest> Admit(ferry::v1::GenerateRequest& request);
  // A fresh StreamProgress for the admitted request (at the start, and for each retry).
  void NewProgress();
  // Whether the scheduler sent anything (tokens or prompt logprobs): a lost attempt then resumes.
  bool HasOutput() const;
  // The current attempt's scheduler was lost after it sent output: the request resumes on another
  // replica, or on this one once it is back (a continuation: its prompt plus the tokens it has, the
  // seeded draw going on from their count), while --migration-limit allows.
  void Migrate(const Status& status);
  // Opens a stream on a healthy replica not tried yet; when none is left, waits for one.
  void StartAttempt();
  // No replica may take the request now (each failed it before any output, or none is up: a
  // scheduler restarting). It keeps its place in its lane and tries them all again after a backoff
  // while its queue timeout, its deadline and kMaxReplicaWait allow; else it ends UNAVAILABLE.
  void WaitForReplica();
  // StreamReader, for the current attempt. An event is counted, folded into a chunk and written,
  // or the stream reads on when there is nothing to show; at the stream's end the call retries
  // elsewhere or concludes.
  void OnEvent(const ferry::v1::TokenEvent& event) override;
  void OnStreamDone(const Status& status) override;
  // Fills the final chunk and records the request's metrics; writes it when the call succeeded.
  void Conclude(const Status& downstream);
  void End();

  GenerationContext& context_;
  CallHooks hooks_;
  std::optional<AdmittedRequest> admitted_;
  LaneSeries* lane_series_ = nullptr;
  std::optional<StreamProgress> progress_;  // set once admitted
  uint64_t prefix_key_ = 0;
  int64_t cost_ = 0;  // tokens the replica has outstanding for this request
  std::vector<size_t> tried_;
  int32_t replica_waits_ = 0;  // backoffs so far (WaitForReplica)
  int32_t migrations_ = 0;     // resumes after a lost scheduler (Migrate)
  // Since when the request waits for a replica (WaitForReplica's bound): its arrival, or its latest
  // migration.
  std::chrono::steady_clock::time_point waiting_since_;
  // The scheduler's deadline for the request: the client's, or its lane's default from its arrival.
  std::chrono::system_clock::time_point deadline_;
  std::optional<size_t> replica_;      // of the current attempt
  SchedulerStream* attempt_ = nullptr;  // the current stream; valid until its OnStreamDone
  bool attempt_started_ = false;        // the current attempt's scheduler sent an event
  bool client_gone_ = false;
  bool wrote_tokens_ = false;        // a chunk with tokens went to the front
  bool wrote_any_ = false;           // a chunk (tokens, text or prompt logprobs) went to the front
  ferry::v1::GenerateChunk held_;    // tokens waiting for --stream-interval; empty when none
  bool final_written_ = false;  // the next WriteDone answers the final chunk
  Status result_;
  // Of the latest attempt: the call's status when no further attempt may be made.
  Status last_attempt_status_{StatusCode::kUnavailable, "no scheduler attempt may be made"};
  int64_t retry_after_ms_ = 0;
};

}  // namespace ferry::gateway
