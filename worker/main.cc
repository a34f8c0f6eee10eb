// ferry-worker: loads a model shard and executes the steps a scheduler sends.
#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "common/logging.h"
#include "common/metrics.h"
#include "common/process.h"
#include "worker/model/model_runner.h"
#include "worker/worker_service.h"

namespace {

struct Flags {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 0;
  int metrics_port = 0;
  std::string ready_file;
  std::string log_level = "info";
  ferry::worker::RunnerOptions runner;
};

void AddFlags(CLI::App& app, Flags& f) {
  app.add_option("--model", f.model, "Hugging Face checkpoint directory")->required();
  app.add_option("--host", f.host, "Address to listen on");
  app.add_option("--port", f.port, "gRPC port (0: kernel chooses; see --ready-file)");
  app.add_option("--metrics-port", f.metrics_port, "Prometheus /metrics port (0: kernel chooses)");
  app.add_option("--ready-file", f.ready_file, "Write {grpc_port, metrics_port} here once serving");
  app.add_option("--dtype", f.runner.dtype, "Compute dtype")->check(CLI::IsMember({"float32"}));
  app.add_option("--block-size", f.runner.block_size, "Tokens per KV block")->check(CLI::Range(1, 1024));
  app.add_option("--num-kv-blocks", f.runner.num_kv_blocks, "KV blocks to allocate (0: from --kv-cache-memory-bytes)");
  app.add_option("--kv-cache-memory-bytes", f.runner.kv_cache_bytes, "KV cache budget when --num-kv-blocks is 0");
  app.add_option("--max-model-len", f.runner.max_model_len, "Longest sequence (0: from config.json)");
  app.add_option("--num-threads", f.runner.num_threads, "Compute threads (0: all cores)");
  app.add_option("--log-level", f.log_level, "trace, debug, info, warn, error");
}

}  // namespace

int main(int argc, char** argv) {
  ferry::BlockShutdownSignals();
  CLI::App app{"ferry-worker: executes engine steps for a Ferry scheduler"};
  Flags flags;
  AddFlags(app, flags);
  CLI11_PARSE(app, argc, argv);
  ferry::InitLogging("worker", flags.log_level);
  flags.runner.model_dir = flags.model;

  std::unique_ptr<ferry::worker::ModelRunner> runner;
  try {
    runner = ferry::worker::ModelRunner::Create(flags.runner);
  } catch (const std::exception& e) {
    spdlog::critical("cannot load model: {}", e.what());
    return 1;
  }
  const auto& info = runner->info();
  spdlog::info("loaded {} ({}), {} KV blocks of {} tokens, max_model_len {}", info.model, info.dtype,
               info.num_kv_blocks, info.block_size, info.max_model_len);

  ferry::MetricsServer metrics(flags.host + ":" + std::to_string(flags.metrics_port));
  ferry::worker::WorkerService service(*runner, metrics.registry());
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(flags.host + ":" + std::to_string(flags.port), grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(64 << 20);
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
