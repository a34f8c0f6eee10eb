// How a request ended, as the gateway's logic says it. The codes are google.rpc.Code's, numbered
// as gRPC numbers them, so the gRPC adapters translate by value (generation_service.cc,
// grpc_scheduler_client.cc) and the HTTP front maps them to HTTP statuses (http/openai_format.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace ferry::gateway {

enum class StatusCode {
  kOk = 0, kCancelled = 1, kUnknown = 2, kInvalidArgument = 3, kDeadlineExceeded = 4, kNotFound = 5,
  kAlreadyExists = 6, kPermissionDenied = 7, kResourceExhausted = 8, kFailedPrecondition = 9, kAborted = 10,
  kOutOfRange = 11, kUnimplemented = 12, kInternal = 13, kUnavailable = 14, kDataLoss = 15, kUnauthenticated = 16,
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode error_code() const { return code_; }
  const std::string& error_message() const { return message_; }
  // When a retry may succeed (RESOURCE_EXHAUSTED, UNAVAILABLE); 0: no hint. The fronts answer it as
  // grpc-retry-pushback-ms and HTTP Retry-After.
  int64_t retry_after_ms() const { return retry_after_ms_; }
  Status& WithRetryAfter(int64_t ms) {
    retry_after_ms_ = ms;
    return *this;
  }
  // The scheduler replica itself ended the request with this status (it is up and said so), as
  // opposed to a failed connection or session (it may be restarting).
  bool from_replica() const { return from_replica_; }
  Status& FromReplica() {
    from_replica_ = true;
    return *this;
  }
  // A DEADLINE_EXCEEDED that is the lane's queue timeout: the request never started because the
  // replica was overloaded, not because its own deadline passed. gRPC keeps DEADLINE_EXCEEDED (with
  // the retry hint); HTTP answers 429 with Retry-After, as for a full lane.
  bool queue_timeout() const { return queue_timeout_; }
  Status& AsQueueTimeout() {
    queue_timeout_ = true;
    return *this;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  int64_t retry_after_ms_ = 0;
  bool from_replica_ = false;
  bool queue_timeout_ = false;
};

}  // namespace ferry::gateway
