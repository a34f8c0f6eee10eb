// Step-time model of a model worker: how long one engine step takes as a
// function of what the step computes. Pure math, no clocks; used by ferry-sim
// (virtual time) and by the `--backend sim` worker (which sleeps for it).
//
//   t = fixed_s + (num_seqs > 1 ? batched_step_s : 0) + per_seq_s * num_seqs
//       + per_context_token_s * num_kv_tokens
//       + max( (weight_bytes + kv_bytes_per_token * num_kv_tokens) / (bandwidth * bandwidth_efficiency),
//              flops_per_token * num_tokens / (peak_flops * flops_efficiency) )
//
// A step reads every weight once and the KV of every context token it
// attends to (memory side), and does ~2 * params FLOPs per computed token
// (compute side); the slower side wins (roofline). The fixed and per-sequence
// terms cover launch, synchronisation, sampling and bookkeeping; the batched
// term is a measured step at one sequence (see CostModelParams). With the
// efficiencies at 1 and the hardware's datasheet numbers this is a roofline;
// fitted efficiencies and overheads reproduce a measured sweep.
#pragma once

#include <cstdint>
#include <string>

namespace ferry {

// What one step computes.
struct StepShape {
  int64_t num_tokens = 0;     // tokens computed: prefill chunks plus one per decode
  int32_t num_seqs = 0;       // sequences in the step
  int64_t num_kv_tokens = 0;  // context tokens whose KV the step reads (sum over sequences)
};

struct CostModelParams {
  std::string name;
  std::string source;  // where the numbers come from (fit, roofline, measurement)
  double fixed_s = 0.0;
  // Extra fixed cost of a step with more than one sequence. 0 for a roofline;
  // the seed's vLLM 0.4.2 sweep has a fast path at one sequence (its step
  // time doubles from 1 to 4 sequences, then grows ~linearly), which a
  // smooth model cannot fit.
  double batched_step_s = 0.0;
  double per_seq_s = 0.0;
  // Compute time per context token a step attends to, outside the roofline:
  // 0 on a GPU, where attention reads KV at the memory side's bandwidth; the
  // CPU engine's attention is arithmetic on two cores, and its step grows
  // with the context beyond what the KV bytes explain (cpu-0.5b preset).
  double per_context_token_s = 0.0;
  double weight_bytes = 0.0;        // read once per step (per tensor-parallel rank)
  double kv_bytes_per_token = 0.0;  // per context token read (per rank)
  double bandwidth_bytes_per_s = 1.0;
  double bandwidth_efficiency = 1.0;
  double flops_per_token = 0.0;     // ~2 * parameters (per rank)
  double peak_flops = 1.0;
  double flops_efficiency = 1.0;
  // KV pool the preset's deployment has, in tokens (0: unknown). The
  // simulator sizes its block pool from it.
  int64_t kv_capacity_tokens = 0;
};

class CostModel {
 public:
  // Throws std::invalid_argument (naming the field) on non-positive bandwidth,
  // peak or efficiency, or negative overheads/sizes.
  explicit CostModel(CostModelParams params);

  double StepSeconds(const StepShape& shape) const;
  // The two roofline sides alone (no overheads), for reports.
  double MemorySeconds(const StepShape& shape) const;
  double ComputeSeconds(const StepShape& shape) const;
  const CostModelParams& params() const { return params_; }

 private:
  CostModelParams params_;
};

// JSON object with the CostModelParams field names (all optional except the
// ones without a usable default: bandwidth_bytes_per_s, peak_flops). Unknown
// keys are rejected so a typo does not silently keep a default. Throws
// std::invalid_argument naming the problem.
CostModelParams CostModelParamsFromJson(const std::string& json_text);
std::string CostModelParamsToJson(const CostModelParams& params);
// Reads a preset file; throws std::runtime_error if it cannot be read.
CostModelParams LoadCostModelParams(const std::string& path);

}  // namespace ferry
