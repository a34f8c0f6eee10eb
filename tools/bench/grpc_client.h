// ferry-bench over gRPC: the gateway's Generation.GenerateStream, and the scheduler's admin RPCs
// (Scheduler.SetMaxNumSeqs / GetState / Info) that the sweep turns.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tools/bench/runner.h"
#include "tools/bench/sampling_options.h"

namespace ferry::bench {

struct GrpcClientOptions {
  std::string target;            // gateway host:port
  std::string api_key;           // sent as "authorization: Bearer <key>" when set
  int32_t num_channels = 4;      // TCP connections, shared round-robin by the runner's threads
  bool ignore_eos = true;        // generate exactly max_tokens (capacity runs need fixed lengths)
  BenchSampling sampling;
  double connect_timeout_s = 10;
};

// Connects the channels (waiting up to connect_timeout_s) and returns a factory of clients that
// share them. A gateway that cannot be reached is not an error here: requests then fail with
// UNAVAILABLE and are counted.
ClientFactory MakeGrpcClientFactory(const GrpcClientOptions& options);

// "OK", "UNAVAILABLE", ... for a grpc::StatusCode value.
std::string GrpcCodeName(int code);

struct SchedulerSnapshot {
  int32_t max_num_seqs = 0;
  std::string controller_mode;
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  double kv_cache_usage = 0;
  uint64_t num_preemptions = 0;
  uint64_t num_cap_changes = 0;
  bool cap_held = false;  // an admin Set holds the cap (SetMaxNumSeqsRequest.adapt)
};

struct SchedulerFacts {
  std::string model;
  int32_t max_model_len = 0;
  int32_t num_kv_blocks = 0;
  int32_t block_size = 0;
  int32_t tensor_parallel_size = 0;
};

// One scheduler's admin surface. Each call throws std::runtime_error naming the RPC and status.
class SchedulerAdmin {
 public:
  explicit SchedulerAdmin(const std::string& address, double timeout_s = 10);
  ~SchedulerAdmin();
  // Held there (adapt = false) or a start the adaptive modes move from (adapt = true).
  SchedulerSnapshot SetMaxNumSeqs(int32_t max_num_seqs, bool adapt = false);
  SchedulerSnapshot GetState();
  SchedulerFacts Info();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::bench
