// One request's life, driven by gRPC callbacks instead of a thread per request. A thread per
// stream on both sides (client handler, scheduler reader) spent about half of the gateway's CPU
// in the kernel switching threads (docs/benchmarks/bench.md 2e).
//
// Flow: Start validates and admits the request on the caller's thread, then opens a scheduler
// `Submit` stream (a ClientReadReactor, one per attempt). Each event is folded into a chunk and
// handed to the front's `write` hook; the next event is read only after the front answers with
// WriteDone, so the client's pace is the stream's flow control, as with the blocking API. When
// the stream ends: a replica that failed before the start is left for another attempt;
// otherwise the call concludes, writes the final chunk (finish reason, usage, timings) and calls
// `done`.
//
// Threads: hooks run on gRPC's callback threads (Start's refusals on the caller's), never two at
// once for one call. The front keeps each attempt's ClientContext alive until `done`.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <grpcpp/client_context.h>
#include <grpcpp/support/status.h>

#include "ferry/v1/generation.pb.h"
#include "ferry/v1/scheduler.grpc.pb.h"
#include "gateway/generator.h"

namespace ferry::gateway {

struct LaneSeries;

// Scheduler attempts one request may make: a replica that fails before the start is left for
// another, up to this many in all. Fronts stop handing out contexts past it.
inline constexpr size_t kMaxSchedulerAttempts = 4;

struct CallHooks {
  // The scheduler call's context for each attempt (owned by the front), or nullptr when no
  // further attempt may be made.
  Generator::ContextFactory make_context;
  // Whether the client gave up (read when a scheduler stream ends).
  std::function<bool()> client_cancelled;
  // A chunk for the client. The front answers with GenerationCall::WriteDone(ok) once the
  // client took it (ok = false: the client is gone).
  std::function<void(ferry::v1::GenerateChunk)> write;
  // The end, once: after the last chunk's WriteDone, or without any chunk when the request was
  // refused or failed. retry_after_ms > 0 when a full lane suggests a retry. The call touches
  // nothing of its own after this hook returns.
  std::function<void(grpc::Status, int64_t retry_after_ms)> done;
};

class GenerationCall : public std::enable_shared_from_this<GenerationCall> {
 public:
  GenerationCall(Generator& generator, CallHooks hooks);
  ~GenerationCall();

  // Validates, admits and opens the first scheduler stream; `done` may run before it returns.
  void Start(ferry::v1::GenerateRequest request);
  // The front's answer to each `write`.
  void WriteDone(bool ok);

 private:
  class Attempt;

  // Opens a stream on a healthy replica not tried yet, or concludes when none is left.
  void StartAttempt();
  // One scheduler event (from the attempt's read): counts it, folds it into a chunk and writes
  // it, or reads on when there is nothing to show.
  void OnEvent(const ferry::v1::TokenEvent& event);
  // The attempt's stream ended: retry elsewhere or conclude.
  void OnAttemptDone(const grpc::Status& status);
  // Fills the final chunk and records the request's metrics; writes it when the call succeeded.
  void Conclude(const grpc::Status& downstream);
  void End();

  Generator& generator_;
  CallHooks hooks_;
  std::optional<AdmittedRequest> admitted_;
  LaneSeries* lane_series_ = nullptr;
  std::optional<StreamProgress> progress_;  // set once admitted
  uint64_t prefix_key_ = 0;
  int64_t cost_ = 0;  // tokens the replica has outstanding for this request
  std::vector<size_t> tried_;
  std::optional<size_t> replica_;  // of the current attempt
  Attempt* attempt_ = nullptr;     // the current stream; valid until its OnDone
  bool client_gone_ = false;
  bool final_written_ = false;  // the next WriteDone answers the final chunk
  grpc::Status result_;
  // Of the latest attempt: the call's status when no further attempt may be made.
  grpc::Status last_attempt_status_{grpc::StatusCode::UNAVAILABLE, "no scheduler attempt may be made"};
  int64_t retry_after_ms_ = 0;
};

}  // namespace ferry::gateway
