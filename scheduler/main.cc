// ferry-scheduler: continuous batching for one model replica.
#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "common/logging.h"
#include "common/metrics.h"
#include "common/process.h"
#include "common/service_main.h"
#include "scheduler/engine_loop.h"
#include "scheduler/scheduler_service.h"
#include "scheduler/worker_client.h"

namespace {

struct Flags {
  ferry::ServiceFlags service;
  std::vector<std::string> workers;
  int max_num_seqs = 256;
  int max_num_batched_tokens = 8192;
  int max_model_len = 0;
  int worker_timeout_s = 600;
};

void AddFlags(CLI::App& app, Flags& f) {
  ferry::AddServiceFlags(app, f.service);
  app.add_option("--worker", f.workers, "Worker address host:port, one per tensor-parallel rank, rank 0 first")
      ->required();
  app.add_option("--max-num-seqs", f.max_num_seqs, "Most sequences in one step")->check(CLI::Range(1, 65536));
  app.add_option("--max-num-batched-tokens", f.max_num_batched_tokens, "Most tokens computed in one step")
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--max-model-len", f.max_model_len, "Longest sequence (0: the worker's)");
  app.add_option("--worker-timeout-s", f.worker_timeout_s, "How long to wait for workers at start");
}

}  // namespace

int main(int argc, char** argv) {
  ferry::BlockShutdownSignals();
  CLI::App app{"ferry-scheduler: continuous batching over Ferry workers"};
  Flags flags;
  AddFlags(app, flags);
  CLI11_PARSE(app, argc, argv);
  ferry::InitLogging("scheduler", flags.service.log_level);

  ferry::scheduler::GrpcWorkerGroup workers(flags.workers);
  ferry::v1::WorkerInfo worker_info;
  try {
    worker_info = workers.WaitForInfo(std::chrono::seconds(flags.worker_timeout_s));
  } catch (const std::exception& e) {
    spdlog::critical("{}", e.what());
    return 1;
  }
  ferry::scheduler::SchedulerConfig config;
  config.max_num_seqs = flags.max_num_seqs;
  config.max_num_batched_tokens = flags.max_num_batched_tokens;
  config.max_model_len = flags.max_model_len > 0 ? std::min(flags.max_model_len, worker_info.max_model_len())
                                                 : worker_info.max_model_len();
  config.block_size = worker_info.block_size();
  config.num_kv_blocks = worker_info.num_kv_blocks();

  ferry::v1::SchedulerInfo info;
  info.set_model(worker_info.model());
  info.set_max_model_len(config.max_model_len);
  info.set_vocab_size(worker_info.vocab_size());
  *info.mutable_eos_token_ids() = worker_info.eos_token_ids();
  info.set_num_kv_blocks(config.num_kv_blocks);
  info.set_block_size(config.block_size);
  *info.mutable_generation_defaults() = worker_info.generation_defaults();
  info.set_tensor_parallel_size(static_cast<int>(flags.workers.size()));
  spdlog::info("model {}: {} KV blocks of {}, max_model_len {}, max_num_seqs {}, max_num_batched_tokens {}",
               info.model(), config.num_kv_blocks, config.block_size, config.max_model_len,
               config.max_num_seqs, config.max_num_batched_tokens);

  ferry::MetricsServer metrics(flags.service.metrics_bind());
  ferry::scheduler::EngineLoop loop(config, workers, metrics.registry());
  ferry::scheduler::SchedulerService service(loop, info);
  return ferry::ServeUntilSignal(flags.service, {&service}, metrics, std::chrono::seconds(2));
}
