// The engine flags users know from `vllm serve`, taken by ferry-launch and forwarded to the
// services that own them: the scheduler plans under max_num_seqs / max_num_batched_tokens and
// owns prefix caching and the cap controller; the worker sizes its KV cache and buffers (block
// size, max_model_len, memory share, dtype, device) and also takes the two batch limits, which
// bound its GPU buffers. Without them, --scheduler-arg / --worker-arg still pass any flag.
// The step and recovery timeouts (#27) go to the scheduler, the step timeout to the workers as
// well; ferry-launch also keeps its own copy for its hung-worker check (supervisor.h).
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/timeouts.h"

namespace ferry::launch {

struct EngineFlags {
  int max_num_seqs = 0;  // 0: the services' defaults
  int max_num_batched_tokens = 0;
  int max_model_len = 0;
  int block_size = 0;
  double gpu_memory_utilization = 0;
  bool prefix_caching_on = false;  // neither: the scheduler's default
  bool prefix_caching_off = false;
  std::string dtype;
  std::string quantization;  // empty: the worker's default (none)
  std::string speculative_config;  // vLLM's JSON; empty: the worker's default (off)
  // LoRA (worker): --enable-lora, --lora-modules NAME=PATH ..., --max-loras, --max-lora-rank,
  // --max-cpu-loras (0: the worker's defaults).
  bool enable_lora = false;
  std::vector<std::string> lora_modules;
  int max_loras = 0;
  int max_lora_rank = 0;
  int max_cpu_loras = 0;
  bool no_quantize_lm_head = false;
  std::string device;
  std::string controller_mode;
  bool enforce_eager = false;
  int step_timeout_s = 0;  // 0: not set (the services' default, kDefaultStepTimeoutS)
  int worker_recovery_timeout_s = 0;  // 0: not set (kDefaultWorkerRecoveryTimeoutS)

  // The values in force, set or not: what the launcher itself works with.
  int step_timeout_or_default_s() const { return step_timeout_s > 0 ? step_timeout_s : kDefaultStepTimeoutS; }
  int worker_recovery_timeout_or_default_s() const {
    return worker_recovery_timeout_s > 0 ? worker_recovery_timeout_s : kDefaultWorkerRecoveryTimeoutS;
  }
  // The scheduler's and the worker's own defaults for the two flags (common/timeouts.h).
  static constexpr int kDefaultStepTimeoutS = ferry::kDefaultStepTimeoutS;
  static constexpr int kDefaultWorkerRecoveryTimeoutS = ferry::kDefaultWorkerRecoveryTimeoutS;
};

void AddEngineFlags(CLI::App& app, EngineFlags& f);

// The flags that were set, as each service's arguments, less any flag the user also passes
// through to that service (`passed`, e.g. --scheduler-arg=--max-num-seqs=5): that one wins,
// where both would make the service refuse to start.
std::vector<std::string> WorkerArgs(const EngineFlags& f, const std::vector<std::string>& passed = {});
std::vector<std::string> SchedulerArgs(const EngineFlags& f, const std::vector<std::string>& passed = {});

}  // namespace ferry::launch
