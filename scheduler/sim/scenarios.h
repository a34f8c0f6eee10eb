// Named setups shared by the ferry-sim CLI and its acceptance tests: the
// seed's max_num_seqs sweep, the standard lanes, and the four workloads the
// adaptive controller is judged on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/cost_model.h"
#include "scheduler/sim/simulator.h"
#include "scheduler/sim/workload.h"

namespace ferry::sim {

// Embedded copies of scheduler/sim/presets/*.json ("rtx4090d-tp4", "h200").
std::vector<std::string> PresetNames();
// A preset name or a path to a JSON file.
CostModelParams LoadPreset(const std::string& name_or_path);

// block_size 16, max_num_batched_tokens 2048, max_model_len 4096, and the KV
// pool from the preset's kv_capacity_tokens (or 1M tokens when unknown).
scheduler::SchedulerConfig DefaultSchedulerConfig(const CostModelParams& params);

// interactive: priority 1, TTFT <= 1 s, TPOT <= 50 ms; batch: priority 0,
// TTFT <= 30 s, TPOT <= 200 ms; default: priority 0, TTFT <= 1 s, TPOT <= 50 ms.
std::vector<LaneConfig> StandardLanes();
// StandardLanes with the interactive and default lanes' SLO replaced (the
// batch lane keeps its own): one pair of numbers says what "good" means and
// what the slo controller targets.
std::vector<LaneConfig> LanesWithSlo(double ttft_s, double tpot_s);

// The seed's benchmark: input ~512 tokens (log-normal, 32..2048), output 128,
// a closed loop of `cap` clients. One row per cap.
struct SweepRow {
  int32_t num_seqs = 0;
  double output_tokens_per_s = 0;
  double p99_e2e_ms = 0;
  double p99_ttft_ms = 0;
  double p99_tpot_ms = 0;
  double success_rate = 0;  // finished within timeout_s
  uint64_t num_preemptions = 0;
  double sim_s = 0;
};
struct SweepOptions {
  std::vector<int32_t> caps = {1, 4, 8, 16, 32, 64};
  int32_t requests_per_client = 40;
  int32_t min_requests = 400;
  double timeout_s = 0.5;
  uint64_t seed = 7;
};
std::vector<TraceRequest> SweepWorkload(int32_t num_requests, uint64_t seed);
std::vector<SweepRow> RunSweep(const CostModel& cost, const SweepOptions& options);
std::string FormatSweep(const std::vector<SweepRow>& rows);

// "steady", "bursty", "diurnal", "spike" (3x overload: a bulk flood, the
// excess all in the batch lane); `spike_multiplier` only affects "spike" (1:
// the same trace's base load, no spike). ScenarioWorkload also takes
// "long-context" (retrieval-augmented chat at 28 req/s, KV-bound) and "chat"
// (section 3's chat lane alone at 70 req/s, near saturation), which are not
// among the four the controller is judged on.
std::vector<std::string> ScenarioNames();
WorkloadOptions ScenarioWorkload(const std::string& name, double spike_multiplier = 3.0);

// Controller options for the named mode over caps [1, max_num_seqs], with
// the SLO targets of the interactive lane.
scheduler::ControllerOptions ControllerFor(scheduler::ControllerMode mode, int32_t max_num_seqs);

}  // namespace ferry::sim
