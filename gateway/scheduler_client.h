// The scheduler replicas as the gateway's logic sees them: a router to choose one, and Submit
// streams read one event at a time. No gRPC here: grpc_scheduler_client.h serves this over
// ferry.v1.Scheduler stubs.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "ferry/v1/scheduler.pb.h"
#include "gateway/replica_router.h"
#include "gateway/status.h"

namespace ferry::gateway {

// Where one stream's events go: one reaction at a time, on the client's threads.
class StreamReader {
 public:
  virtual ~StreamReader() = default;
  // One event; the reader answers with the stream's ReadNext or StopReading.
  virtual void OnEvent(const ferry::v1::TokenEvent& event) = 0;
  // The end, once reading stopped, with the scheduler's (or the transport's) status. The stream
  // is deleted when this returns.
  virtual void OnStreamDone(const Status& status) = 0;
};

// One Submit stream; it owns itself once started.
class SchedulerStream {
 public:
  virtual ~SchedulerStream() = default;
  // Opens the stream and reads its first event; reactions may run before it returns.
  virtual void Start() = 0;
  virtual void ReadNext() = 0;
  // No further read; OnStreamDone follows once the status is in. The caller's last touch.
  virtual void StopReading() = 0;
  // Any thread, until OnStreamDone returns: the scheduler frees the sequence.
  virtual void Cancel() = 0;
};

class SchedulerClient {
 public:
  virtual ~SchedulerClient() = default;
  virtual ReplicaRouter& router() = 0;
  // A stream (not started yet) submitting `submit` (which outlives it) to replica `replica`,
  // ending at `deadline` (time_point::max(): none); its events go to `reader`.
  virtual SchedulerStream* NewStream(size_t replica, const ferry::v1::SubmitRequest& submit,
                                     std::chrono::system_clock::time_point deadline,
                                     std::shared_ptr<StreamReader> reader) = 0;
  // Runs `fn` once, on the client's timer thread, after `delay` (a request waiting for a replica).
  virtual void After(std::chrono::milliseconds delay, std::function<void()> fn) = 0;
  // Admin: Scheduler.LoadLoraAdapter / UnloadLoraAdapter on replica `replica`, waiting for the answer
  // (the scheduler's status, or the transport's). A client without them answers UNIMPLEMENTED.
  virtual Status LoadLora(size_t /*replica*/, const std::string& /*name*/, const std::string& /*path*/) {
    return {StatusCode::kUnimplemented, "this scheduler client loads no LoRA adapters"};
  }
  virtual Status UnloadLora(size_t /*replica*/, const std::string& /*name*/) {
    return {StatusCode::kUnimplemented, "this scheduler client loads no LoRA adapters"};
  }
};

}  // namespace ferry::gateway
