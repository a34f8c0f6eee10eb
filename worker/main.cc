// ferry-worker: loads a model shard and executes the steps a scheduler sends.
#include <cstdlib>

#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "common/logging.h"
#include "common/metrics.h"
#include "common/process.h"
#include "common/service_main.h"
#include "common/timeouts.h"
#include "worker/comm/communicator.h"
#include "worker/engine/model_runner.h"
#include "worker/engine/speculative_config.h"
#include "worker/gpu_plugin.h"
#include "worker/model/linear.h"
#include "worker/sim_runner.h"
#include "worker/worker_service.h"

namespace {

// The exit code of a rank whose tensor-parallel group broke (a peer died, stopped or timed
// out): its supervisor restarts the whole group (worker/README.md).
constexpr int kExitGroupBroken = 3;

struct Flags {
  ferry::ServiceFlags service;
  std::string model;
  std::string backend = "cpu";
  std::string cost_model;
  int sim_live_tokens = 0;
  bool sim_overlap = false;
  int tensor_parallel_size = 1;
  int tp_rank = 0;
  std::string dist_store_dir;
  int dist_timeout_s = 30;
  int step_timeout_s = ferry::kDefaultStepTimeoutS;
  ferry::worker::RunnerOptions runner;
  // --device cuda
  std::string device = "cpu";
  int cuda_device = -1;  // -1: the tensor-parallel rank
  float gpu_memory_utilization = 0.9f;
  int max_num_seqs = 256;
  int max_num_batched_tokens = 8192;
  bool enforce_eager = false;
  std::string gpu_plugin;  // empty: libferry-gpu.so beside the executable
  std::string speculative_config;  // vLLM's JSON; empty: off
  std::vector<std::string> lora_modules;  // NAME=PATH
};

void AddFlags(CLI::App& app, Flags& f) {
  ferry::AddServiceFlags(app, f.service);
  app.add_option("--model", f.model, "Hugging Face checkpoint directory")->required();
  app.add_option("--dtype", f.runner.dtype,
                 "Matmul dtype: bfloat16 (fast; AVX-512), float32 (exact) or auto (bfloat16 where the CPU runs it)")
      ->check(CLI::IsMember({"auto", "bfloat16", "float32"}));
  app.add_option("--quantization", f.runner.quantization,
                 "int8: W8A8 matmuls (weights per channel at load, activations per token; AVX-512 VNNI, "
                 "else AVX2), CPU engine only; none: as --dtype says")
      ->check(CLI::IsMember({"none", "int8"}));
  app.add_flag("--quantize-lm-head,!--no-quantize-lm-head", f.runner.quantize_lm_head,
               "Quantize the LM head too under --quantization (default); --no-quantize-lm-head keeps it in --dtype");
  app.add_option("--speculative-config", f.speculative_config,
                 "Speculative decoding default, vLLM's JSON: {\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                 "\"prompt_lookup_max\": 4, \"prompt_lookup_min\": 1}; requests may override method and count "
                 "(sampling.speculative). CPU engine only");
  app.add_option("--backend", f.backend, "cpu: the real engine; sim: sleep for a cost model's step time")
      ->check(CLI::IsMember({"cpu", "sim"}));
  app.add_option("--cost-model", f.cost_model, "Cost model JSON for --backend sim (e.g. scheduler/sim/presets/)");
  app.add_option("--sim-live-tokens", f.sim_live_tokens, "--backend sim samples ids below this (0: vocab size)");
  app.add_flag("--sim-overlap", f.sim_overlap,
               "--backend sim models a device that runs steps asynchronously: the host prepares the next step "
               "while one runs, as the GPU engine does");
  app.add_option("--tensor-parallel-size", f.tensor_parallel_size, "Ranks sharing the model")->check(CLI::Range(1, 64));
  app.add_option("--tp-rank", f.tp_rank, "This worker's rank in [0, --tensor-parallel-size)");
  app.add_option("--dist-store-dir", f.dist_store_dir, "Rendezvous directory shared by all ranks (Gloo FileStore)");
  app.add_option("--dist-timeout-s", f.dist_timeout_s,
                 "Longest wait for the other ranks: joining the group, and each collective (a dead or stopped "
                 "peer); past it the worker exits with code 3")->check(CLI::Range(1, 86400));
  app.add_option("--step-timeout-s", f.step_timeout_s,
                 "Health fails (and grpc.health NOT_SERVING) while a step has run longer than this, so a "
                 "supervisor restarts the worker (0: off)")
      ->check(CLI::Range(0, 86400))
      ->capture_default_str();
  app.add_option("--block-size", f.runner.block_size, "Tokens per KV block")->check(CLI::Range(1, 1024));
  app.add_option("--num-kv-blocks", f.runner.num_kv_blocks, "KV blocks to allocate (0: from --kv-cache-memory-bytes)");
  app.add_option("--kv-cache-memory-bytes", f.runner.kv_cache_bytes, "KV cache budget when --num-kv-blocks is 0");
  app.add_option("--max-model-len", f.runner.max_model_len, "Longest sequence (0: from config.json)");
  app.add_option("--num-threads", f.runner.num_threads, "Compute threads (0: all cores)");
  app.add_option("--device", f.device, "Where --backend cpu runs the model: cpu, or cuda (the GPU engine)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--cuda-device", f.cuda_device, "CUDA ordinal for --device cuda (-1: the --tp-rank)");
  app.add_option("--gpu-memory-utilization", f.gpu_memory_utilization,
                 "Fraction of the GPU's memory for weights, activations and KV cache (--device cuda)")
      ->check(CLI::Range(0.01f, 1.0f));
  app.add_option("--max-num-seqs", f.max_num_seqs,
                 "Most sequences in a step the GPU buffers hold (--device cuda); the CPU engine reserves its "
                 "logits workspace for this many at start")
      ->check(CLI::Range(1, 4096));
  app.add_option("--max-num-batched-tokens", f.max_num_batched_tokens,
                 "Most tokens in a step the GPU buffers hold (--device cuda); the CPU engine reserves its "
                 "activation workspace for a step this large at start")->check(CLI::Range(1, 1 << 20));
  app.add_flag("--enforce-eager", f.enforce_eager, "No CUDA graphs for decode steps (--device cuda)");
  // LoRA (issue #57), vLLM's flags.
  app.add_flag("--enable-lora", f.runner.lora.enable, "Serve LoRA adapters (--lora-modules)");
  app.add_option("--lora-modules", f.lora_modules,
                 "NAME=PATH: a LoRA adapter in PEFT's layout served as NAME (repeatable; needs --enable-lora)");
  app.add_option("--max-loras", f.runner.lora.max_loras, "Most distinct LoRA adapters in one step")
      ->check(CLI::Range(1, 1024));
  app.add_option("--max-lora-rank", f.runner.lora.max_lora_rank, "Largest adapter rank served")
      ->check(CLI::Range(1, 512));
  app.add_option("--max-cpu-loras", f.runner.lora.max_cpu_loras,
                 "Adapters kept in memory (0: --max-loras); the others are read again at their next use")
      ->check(CLI::Range(0, 65536));
  app.add_option("--gpu-plugin", f.gpu_plugin, "The GPU engine library for --device cuda (default: "
                 "libferry-gpu.so beside ferry-worker)");
}

// --lora-modules NAME=PATH into the runner's options (both engines').
std::vector<std::pair<std::string, std::string>> ParseLoraModules(const std::vector<std::string>& modules) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& module : modules) {
    const size_t eq = module.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == module.size()) {
      throw std::invalid_argument("--lora-modules \"" + module + "\": want NAME=PATH");
    }
    out.push_back({module.substr(0, eq), module.substr(eq + 1)});
  }
  return out;
}

std::unique_ptr<ferry::worker::ModelRunner> MakeCudaRunner(const Flags& flags, prometheus::Registry& registry) {
  ferry::worker::GpuPluginOptions o;
  o.engine.runner = flags.runner;
  o.engine.runner.lora.modules = ParseLoraModules(flags.lora_modules);
  o.engine.device = flags.cuda_device >= 0 ? flags.cuda_device : flags.tp_rank;
  o.engine.gpu_memory_utilization = flags.gpu_memory_utilization;
  o.engine.max_num_seqs = flags.max_num_seqs;
  o.engine.max_num_batched_tokens = flags.max_num_batched_tokens;
  o.engine.enforce_eager = flags.enforce_eager;
  o.engine.tp_rank = flags.tp_rank;
  o.engine.tp_size = flags.tensor_parallel_size;
  o.dist_store_dir = flags.dist_store_dir;
  o.engine.dist_timeout_s = flags.dist_timeout_s;
  // Refused before the plugin and the weights load (the runner checks again).
  if (const std::string error = ferry::worker::gpu::CudaRunnerOptionsError(o.engine); !error.empty()) {
    throw std::invalid_argument(error);
  }
  return ferry::worker::LoadGpuRunner(flags.gpu_plugin, o, registry);
}

std::unique_ptr<ferry::worker::ModelRunner> MakeRunner(const Flags& flags, prometheus::Registry& registry) {
  if (flags.runner.quantization != "none" && (flags.backend != "cpu" || flags.device != "cpu")) {
    throw std::invalid_argument("--quantization " + flags.runner.quantization +
                                " runs on the CPU engine only (--backend cpu --device cpu)");
  }
  if (!flags.speculative_config.empty() && (flags.backend != "cpu" || flags.device != "cpu")) {
    throw std::invalid_argument("--speculative-config runs on the CPU engine only (--backend cpu --device cpu)");
  }
  if (flags.runner.lora.enable && flags.backend != "cpu") {
    throw std::invalid_argument("--enable-lora runs on the CPU and GPU engines (--backend cpu), not --backend " +
                                flags.backend);
  }
  if (flags.backend == "cpu" && flags.device == "cuda") return MakeCudaRunner(flags, registry);
  if (flags.backend == "cpu") {
    ferry::worker::RunnerOptions runner = flags.runner;
    runner.lora.modules = ParseLoraModules(flags.lora_modules);
    runner.speculative = ferry::worker::ParseSpeculativeConfig(flags.speculative_config);
    runner.reserve_tokens = flags.max_num_batched_tokens;
    runner.reserve_logits_rows = flags.max_num_seqs;
    return ferry::worker::ModelRunner::Create(runner);
  }
  if (flags.cost_model.empty()) throw std::invalid_argument("--backend sim needs --cost-model");
  ferry::worker::SimOptions sim;
  sim.model_dir = flags.model;
  sim.cost = ferry::LoadCostModelParams(flags.cost_model);
  sim.block_size = flags.runner.block_size;
  sim.num_kv_blocks = flags.runner.num_kv_blocks;
  sim.max_model_len = flags.runner.max_model_len;
  sim.num_live_tokens = flags.sim_live_tokens;
  sim.overlap = flags.sim_overlap;
  return std::make_unique<ferry::worker::SimRunner>(sim);
}

}  // namespace

int main(int argc, char** argv) {
  ferry::BlockShutdownSignals();
  ferry::IgnoreBrokenPipes();
  CLI::App app{"ferry-worker: executes engine steps for a Ferry scheduler"};
  Flags flags;
  AddFlags(app, flags);
  CLI11_PARSE(app, argc, argv);
  ferry::InitLogging("worker", flags.service.log_level);
  flags.runner.model_dir = flags.model;
  if (flags.tp_rank < 0 || flags.tp_rank >= flags.tensor_parallel_size) {
    spdlog::critical("--tp-rank {} is outside [0, {})", flags.tp_rank, flags.tensor_parallel_size);
    return 2;
  }
  std::unique_ptr<ferry::worker::Communicator> comm;
  // The GPU engine joins its group over NCCL inside the runner (device collectives).
  if (flags.tensor_parallel_size > 1 && flags.device == "cuda" && flags.dist_store_dir.empty()) {
    spdlog::critical("--tensor-parallel-size {} needs --dist-store-dir", flags.tensor_parallel_size);
    return 2;
  }
  if (flags.tensor_parallel_size > 1 && flags.device != "cuda") {
    if (flags.dist_store_dir.empty()) {
      spdlog::critical("--tensor-parallel-size {} needs --dist-store-dir", flags.tensor_parallel_size);
      return 2;
    }
    try {
      comm = ferry::worker::CreateGlooCommunicator({.rank = flags.tp_rank,
                                                    .size = flags.tensor_parallel_size,
                                                    .store_dir = flags.dist_store_dir,
                                                    .timeout_s = flags.dist_timeout_s});
    } catch (const std::exception& e) {
      spdlog::critical("rank {} cannot join its group: {}", flags.tp_rank, e.what());
      return 1;
    }
    flags.runner.comm = comm.get();
    spdlog::info("rank {} of {} joined", flags.tp_rank, flags.tensor_parallel_size);
  }

  // /metrics first: the GPU engine registers its series while it loads.
  ferry::MetricsServer metrics(flags.service.metrics_bind());
  std::unique_ptr<ferry::worker::ModelRunner> runner;
  try {
    runner = MakeRunner(flags, metrics.registry());
  } catch (const std::exception& e) {
    spdlog::critical("cannot load model: {}", e.what());
    return 1;
  }
  const auto& info = runner->info();
  spdlog::info("loaded {} ({}, quantization {}), {} KV blocks of {} tokens, max_model_len {}", info.model,
               info.dtype, info.quantization, info.num_kv_blocks, info.block_size, info.max_model_len);
  if (flags.backend == "cpu" && flags.device == "cpu") {
    namespace fw = ferry::worker;
    spdlog::info("CPU matmuls through {} (FERRY_CPU_MATMUL=ferry|onednn overrides)",
                 fw::MatmulBackendName(fw::ChooseMatmulBackend(fw::ParseMatmulDtype(info.dtype))));
  }

  ferry::worker::DeviceMetrics device(metrics.registry(),
                                      {.gpu_index = flags.cuda_device >= 0 ? flags.cuda_device : flags.tp_rank});
  ferry::worker::WorkerServiceOptions options{.device = &device, .step_timeout_s = flags.step_timeout_s};
  // Nothing to drain: the group is gone, and the scheduler keeps the step's requests for the
  // restarted group. std::_Exit: the other threads may be blocked on the dead peer.
  options.on_group_failure = [](const std::string&) {
    spdlog::critical("exiting with code {} so that the supervisor restarts the group", kExitGroupBroken);
    spdlog::shutdown();
    std::_Exit(kExitGroupBroken);
  };
  ferry::worker::WorkerService service(*runner, metrics.registry(), options);
  // A sticky device error, a broken group or a hung step turns grpc.health NOT_SERVING (and
  // the Health RPC false, with the reason).
  ferry::ServeHooks hooks;
  hooks.is_ready = [&service] { return service.HealthProblem().empty(); };
  return ferry::ServeUntilSignal(flags.service, {&service}, metrics, std::chrono::seconds(2), hooks);
}
