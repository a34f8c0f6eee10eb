// ferry-gateway: the public gRPC front of a Ferry deployment.
#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <thread>

#include "common/logging.h"
#include "common/metrics.h"
#include "common/process.h"
#include "gateway/generation_service.h"

namespace {

struct Flags {
  std::string scheduler;
  std::string tokenizer;
  std::string host = "127.0.0.1";
  int port = 0;
  int metrics_port = 0;
  std::string ready_file;
  std::string log_level = "info";
  int scheduler_timeout_s = 600;
};

void AddFlags(CLI::App& app, Flags& f) {
  app.add_option("--scheduler", f.scheduler, "Scheduler address host:port")->required();
  app.add_option("--tokenizer", f.tokenizer, "tokenizer.json, or the model directory holding it")->required();
  app.add_option("--host", f.host, "Address to listen on");
  app.add_option("--port", f.port, "gRPC port (0: kernel chooses; see --ready-file)");
  app.add_option("--metrics-port", f.metrics_port, "Prometheus /metrics port (0: kernel chooses)");
  app.add_option("--ready-file", f.ready_file, "Write {grpc_port, metrics_port} here once serving");
  app.add_option("--scheduler-timeout-s", f.scheduler_timeout_s, "How long to wait for the scheduler at start");
  app.add_option("--log-level", f.log_level, "trace, debug, info, warn, error");
}

// The gateway validates against the model's limits, so it needs the scheduler
// up first; it waits rather than failing while the stack starts.
ferry::v1::SchedulerInfo WaitForScheduler(ferry::v1::Scheduler::Stub& stub, int timeout_s) {
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(timeout_s);
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(deadline);
    context.set_wait_for_ready(true);
    ferry::v1::SchedulerInfo info;
    grpc::Status status = stub.Info(&context, {}, &info);
    if (status.ok()) return info;
    if (std::chrono::system_clock::now() >= deadline) {
      throw std::runtime_error("scheduler not ready: " + status.error_message());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace

int main(int argc, char** argv) {
  ferry::BlockShutdownSignals();
  CLI::App app{"ferry-gateway: public gRPC API of Ferry"};
  Flags flags;
  AddFlags(app, flags);
  CLI11_PARSE(app, argc, argv);
  ferry::InitLogging("gateway", flags.log_level);

  std::string tokenizer_path = flags.tokenizer;
  if (std::filesystem::is_directory(tokenizer_path)) tokenizer_path += "/tokenizer.json";
  std::unique_ptr<ferry::tokenizer::Tokenizer> tokenizer;
  try {
    tokenizer = ferry::tokenizer::Tokenizer::FromFile(tokenizer_path);
  } catch (const std::exception& e) {
    spdlog::critical("cannot load tokenizer: {}", e.what());
    return 1;
  }

  auto channel = grpc::CreateChannel(flags.scheduler, grpc::InsecureChannelCredentials());
  ferry::gateway::GatewayOptions options;
  try {
    auto stub = ferry::v1::Scheduler::NewStub(channel);
    const auto info = WaitForScheduler(*stub, flags.scheduler_timeout_s);
    options.limits = {info.max_model_len(), info.vocab_size()};
    spdlog::info("scheduler ready: model {}, max_model_len {}, vocab {}", info.model(), info.max_model_len(),
                 info.vocab_size());
  } catch (const std::exception& e) {
    spdlog::critical("{}", e.what());
    return 1;
  }

  ferry::MetricsServer metrics(flags.host + ":" + std::to_string(flags.metrics_port));
  ferry::gateway::GenerationService service(*tokenizer, channel, options, metrics.registry());
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
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return 0;
}
