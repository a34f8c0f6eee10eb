#include "tools/launch/engine_flags.h"

#include <stdio.h>

#include <algorithm>
#include <array>
#include <cctype>

#include <spdlog/spdlog.h>

#include "scheduler/cap/cap_mode.h"

namespace ferry::launch {

void AddEngineFlags(CLI::App& app, EngineFlags& f) {
  const std::string group = "Engine (vLLM's names; forwarded)";
  app.add_option("--max-num-seqs", f.max_num_seqs, "Sequences per step (scheduler cap; worker buffers)")
      ->check(CLI::Range(1, 4096))
      ->group(group);
  app.add_option("--max-num-batched-tokens", f.max_num_batched_tokens, "Tokens per step (scheduler; worker)")
      ->check(CLI::Range(1, 1048576))
      ->group(group);
  app.add_option("--max-model-len", f.max_model_len, "Longest sequence (worker; default: config.json)")
      ->check(CLI::Range(1, 1 << 24))
      ->group(group);
  app.add_option("--block-size", f.block_size, "Tokens per KV block (worker)")
      ->check(CLI::Range(1, 1024))
      ->group(group);
  app.add_option("--gpu-memory-utilization", f.gpu_memory_utilization, "GPU memory share (worker, --device cuda)")
      ->check(CLI::Range(0.01, 1.0))
      ->group(group);
  CLI::Option* on = app.add_flag("--enable-prefix-caching", f.prefix_caching_on,
                                 "Share KV blocks of identical prefixes (scheduler; default on)")
                        ->group(group);
  app.add_flag("--no-enable-prefix-caching", f.prefix_caching_off, "No prefix caching (scheduler)")
      ->excludes(on)
      ->group(group);
  app.add_option("--dtype", f.dtype, "Weights and activations (worker)")
      ->check(CLI::IsMember({"auto", "bfloat16", "float32"}))
      ->group(group);
  app.add_option("--speculative-config", f.speculative_config,
                 "Speculative decoding default, vLLM's JSON, e.g. {\"method\": \"ngram\", \"num_speculative_tokens\": 4} "
                 "(worker; CPU engine)");
  app.add_flag("--enable-lora", f.enable_lora, "Serve LoRA adapters (worker; CPU engine)")->group(group);
  app.add_option("--lora-modules", f.lora_modules,
                 "NAME=PATH: a PEFT adapter served as model NAME (worker; repeatable; needs --enable-lora)")
      ->group(group);
  app.add_option("--max-loras", f.max_loras, "Most distinct adapters in one step (worker)")
      ->check(CLI::Range(1, 1024))
      ->group(group);
  app.add_option("--max-lora-rank", f.max_lora_rank, "Largest adapter rank (worker)")
      ->check(CLI::Range(1, 512))
      ->group(group);
  app.add_option("--max-cpu-loras", f.max_cpu_loras, "Adapters kept in memory (worker; 0: --max-loras)")
      ->check(CLI::Range(0, 65536))
      ->group(group);
  app.add_option("--quantization", f.quantization, "int8: W8A8 matmuls on the CPU engine (worker)")
      ->check(CLI::IsMember({"none", "int8"}))
      ->group(group);
  app.add_flag("--no-quantize-lm-head", f.no_quantize_lm_head,
               "Keep the LM head in --dtype under --quantization (worker)")
      ->group(group);
  app.add_option("--device", f.device, "cpu or cuda (worker)")->check(CLI::IsMember({"cpu", "cuda"}))->group(group);
  app.add_option("--controller-mode", f.controller_mode, "max_num_seqs controller (scheduler)")
      ->check(CLI::IsMember(ferry::scheduler::ControllerModeValues()))  // the scheduler's registry
      ->group(group);
  app.add_flag("--enforce-eager", f.enforce_eager, "No CUDA graphs (worker, --device cuda)")->group(group);
  app.add_option("--step-timeout-s", f.step_timeout_s,
                 "A step (or a worker's Health) slower than this loses the worker (scheduler, worker; the "
                 "launcher kills and restarts a worker silent this long; default " +
                     std::to_string(EngineFlags::kDefaultStepTimeoutS) + ")")
      ->check(CLI::Range(1, 86400))
      ->group(group);
  app.add_option("--worker-recovery-timeout-s", f.worker_recovery_timeout_s,
                 "How long the scheduler keeps requests for a lost worker to come back (scheduler; default " +
                     std::to_string(EngineFlags::kDefaultWorkerRecoveryTimeoutS) + ")")
      ->check(CLI::Range(1, 86400))
      ->group(group);
}

namespace {

// "--name=value" or "--name" -> "--name".
std::string FlagName(const std::string& arg) { return arg.substr(0, arg.find('=')); }

std::vector<std::string> Without(std::vector<std::string> forwarded, const std::vector<std::string>& passed) {
  std::erase_if(forwarded, [&](const std::string& arg) {
    return std::any_of(passed.begin(), passed.end(),
                       [&](const std::string& p) { return FlagName(p) == FlagName(arg); });
  });
  return forwarded;
}

// The two limits both services take: the scheduler plans under them, the worker sizes buffers.
std::vector<std::string> BatchLimits(const EngineFlags& f) {
  std::vector<std::string> out;
  if (f.max_num_seqs > 0) out.push_back("--max-num-seqs=" + std::to_string(f.max_num_seqs));
  if (f.max_num_batched_tokens > 0) {
    out.push_back("--max-num-batched-tokens=" + std::to_string(f.max_num_batched_tokens));
  }
  return out;
}

}  // namespace

std::vector<std::string> WorkerArgs(const EngineFlags& f, const std::vector<std::string>& passed) {
  std::vector<std::string> out = BatchLimits(f);
  if (f.max_model_len > 0) out.push_back("--max-model-len=" + std::to_string(f.max_model_len));
  if (f.block_size > 0) out.push_back("--block-size=" + std::to_string(f.block_size));
  if (f.gpu_memory_utilization > 0) {
    out.push_back("--gpu-memory-utilization=" + std::to_string(f.gpu_memory_utilization));
  }
  if (!f.dtype.empty()) out.push_back("--dtype=" + f.dtype);
  if (!f.quantization.empty()) out.push_back("--quantization=" + f.quantization);
  if (!f.speculative_config.empty()) out.push_back("--speculative-config=" + f.speculative_config);
  if (f.enable_lora) out.push_back("--enable-lora");
  for (const std::string& m : f.lora_modules) out.push_back("--lora-modules=" + m);
  if (f.max_loras > 0) out.push_back("--max-loras=" + std::to_string(f.max_loras));
  if (f.max_lora_rank > 0) out.push_back("--max-lora-rank=" + std::to_string(f.max_lora_rank));
  if (f.max_cpu_loras > 0) out.push_back("--max-cpu-loras=" + std::to_string(f.max_cpu_loras));
  if (f.no_quantize_lm_head) out.push_back("--no-quantize-lm-head");
  if (!f.device.empty()) out.push_back("--device=" + f.device);
  if (f.enforce_eager) out.push_back("--enforce-eager");
  // Always: a worker's own default is off, and under ferry-launch its Health should turn false
  // past the step timeout, which the launcher's probe acts on (supervisor.h).
  out.push_back("--step-timeout-s=" + std::to_string(f.step_timeout_or_default_s()));
  return Without(std::move(out), passed);
}

std::vector<std::string> SchedulerArgs(const EngineFlags& f, const std::vector<std::string>& passed) {
  std::vector<std::string> out = BatchLimits(f);
  if (f.prefix_caching_on) out.push_back("--enable-prefix-caching");
  if (f.prefix_caching_off) out.push_back("--no-enable-prefix-caching");
  if (!f.controller_mode.empty()) out.push_back("--controller-mode=" + f.controller_mode);
  if (f.step_timeout_s > 0) out.push_back("--step-timeout-s=" + std::to_string(f.step_timeout_s));
  if (f.worker_recovery_timeout_s > 0) {
    out.push_back("--worker-recovery-timeout-s=" + std::to_string(f.worker_recovery_timeout_s));
  }
  return Without(std::move(out), passed);
}

}  // namespace ferry::launch
