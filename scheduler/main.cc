// ferry-scheduler: continuous batching for one model replica.
#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "common/logging.h"
#include "common/metrics.h"
#include "common/process.h"
#include "scheduler/engine_loop.h"
#include "scheduler/scheduler_service.h"
#include "scheduler/worker_client.h"

namespace {

struct Flags {
  std::vector<std::string> workers;
  std::string host = "127.0.0.1";
  int port = 0;
  int metrics_port = 0;
  std::string ready_file;
  std::string log_level = "info";
  int max_num_seqs = 256;
  int max_num_batched_tokens = 8192;
  int max_model_len = 0;
  int worker_timeout_s = 600;
};

void AddFlags(CLI::App& app, Flags& f) {
  app.add_option("--worker", f.workers, "Worker address host:port, one per tensor-parallel rank, rank 0 first")
      ->required();
  app.add_option("--host", f.host, "Address to listen on");
  app.add_option("--port", f.port, "gRPC port (0: kernel chooses; see --ready-file)");
  app.add_option("--metrics-port", f.metrics_port, "Prometheus /metrics port (0: kernel chooses)");
  app.add_option("--ready-file", f.ready_file, "Write {grpc_port, metrics_port} here once serving");
  app.add_option("--max-num-seqs", f.max_num_seqs, "Most sequences in one step")->check(CLI::Range(1, 65536));
  app.add_option("--max-num-batched-tokens", f.max_num_batched_tokens, "Most tokens computed in one step")
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--max-model-len", f.max_model_len, "Longest sequence (0: the worker's)");
  app.add_option("--worker-timeout-s", f.worker_timeout_s, "How long to wait for workers at start");
  app.add_option("--log-level", f.log_level, "trace, debug, info, warn, error");
}

}  // namespace

int main(int argc, char** argv) {
  ferry::BlockShutdownSignals();
  CLI::App app{"ferry-scheduler: continuous batching over Ferry workers"};
  Flags flags;
  AddFlags(app, flags);
  CLI11_PARSE(app, argc, argv);
  ferry::InitLogging("scheduler", flags.log_level);

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
  spdlog::info("model {}: {} KV blocks of {}, max_model_len {}, max_num_seqs {}, max_num_batched_tokens {}",
               info.model(), config.num_kv_blocks, config.block_size, config.max_model_len,
               config.max_num_seqs, config.max_num_batched_tokens);

  ferry::MetricsServer metrics(flags.host + ":" + std::to_string(flags.metrics_port));
  ferry::scheduler::EngineLoop loop(config, workers, metrics.registry());
  ferry::scheduler::SchedulerService service(loop, info);
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(flags.host + ":" + std::to_string(flags.port), grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  if (!server || port == 0) {
    spdlog::critical("cannot listen on {}:{}", flags.host, flags.port);
    return 1;
  }
  spdlog::info("serving on {}:{}, metrics on :{}", flags.host, port, metrics.port());
  ferry::WriteReadyFile(flags.ready_file, {{"grpc_port", port}, {"metrics_port", metrics.port()}});

  const int sig = ferry::WaitForShutdownSignal();
  spdlog::info("signal {}: shutting down", sig);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}
