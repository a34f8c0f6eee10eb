// ferry-sim's engine: the real SchedulerCore and Controller driven in
// virtual time. A discrete-event loop: arrivals are added when the clock
// passes them; each step is Plan -> step time from the CostModel -> Commit
// with arbitrary tokens; requests end by max_tokens (no eos). No sleeping,
// sockets or threads.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/cost_model.h"
#include "scheduler/cap/controller.h"
#include "scheduler/core/replica.h"
#include "scheduler/core/types.h"
#include "scheduler/sim/workload.h"

namespace ferry::sim {

// A lane's priority and SLO. Requests of an unknown lane get the defaults.
struct LaneConfig {
  std::string name = "default";
  int32_t priority = 0;
  double ttft_slo_s = 1.0;
  double tpot_slo_s = 0.050;
};

struct SimOptions {
  scheduler::SchedulerConfig scheduler;  // max_num_seqs here is unused: the controller sets it
  scheduler::ControllerOptions controller;
  std::vector<LaneConfig> lanes;
  // > 0: a closed loop of this many clients; request i + concurrency is sent
  // when a client's previous request ends (arrival_s is ignored).
  int32_t closed_loop_concurrency = 0;
  double max_sim_s = std::numeric_limits<double>::infinity();  // stop the clock here
  // Tests: every input to the simulation's replica is appended here (scheduler/core/replica.h).
  std::vector<scheduler::ReplicaInput>* record = nullptr;
};

struct RequestResult {
  TraceRequest request;
  double arrival_s = 0;  // when it was added (closed loop: when its client sent it)
  double first_token_s = -1;
  double end_s = -1;     // -1: unfinished when the simulation stopped
  int32_t num_output = 0;
  int32_t num_preemptions = 0;
  int32_t num_cached_tokens = 0;  // prompt tokens the prefix cache held at its first scheduling

  bool is_finished() const { return end_s >= 0; }
  double ttft_s() const { return first_token_s - arrival_s; }
  double e2e_s() const { return end_s - arrival_s; }
  double tpot_s() const {
    return num_output > 1 ? (end_s - first_token_s) / (num_output - 1) : 0.0;
  }
};

struct CapPoint {
  double time_s = 0;
  int32_t num_seqs = 0;
};

struct SimResult {
  std::vector<RequestResult> requests;  // in trace order
  std::vector<scheduler::CapChange> changes;
  std::vector<CapPoint> caps;           // the cap after each change, from t = 0
  double sim_s = 0;                     // virtual time at the end
  double busy_s = 0;                    // time spent in steps
  uint64_t num_steps = 0;
  uint64_t num_preemptions = 0;
  int64_t num_output_tokens = 0;
  // Closed loop: output tokens of steps that ended while every client was
  // busy, and when that stopped (the last request was sent).
  int64_t steady_output_tokens = 0;
  double steady_end_s = 0;
};

// Throws std::invalid_argument if a request does not fit the scheduler
// config (the core's message).
SimResult RunSimulation(const std::vector<TraceRequest>& trace, const CostModel& cost,
                        const SimOptions& options);

const LaneConfig& FindLane(const std::vector<LaneConfig>& lanes, const std::string& name);
// The replica a simulation of `trace` drives is Replica(SimSchedulerConfig(options, trace), options.controller).
scheduler::SchedulerConfig SimSchedulerConfig(const SimOptions& options, const std::vector<TraceRequest>& trace);

}  // namespace ferry::sim
