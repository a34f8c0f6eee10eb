// ferry-gateway: the public gRPC front of a Ferry deployment.
#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <thread>

#include "common/logging.h"
#include "common/metrics.h"
#include "common/process.h"
#include "common/service_main.h"
#include "gateway/generation_service.h"

namespace {

struct Flags {
  ferry::ServiceFlags service;
  std::string scheduler;
  std::string tokenizer;
  int scheduler_timeout_s = 600;
};

void AddFlags(CLI::App& app, Flags& f) {
  ferry::AddServiceFlags(app, f.service);
  app.add_option("--scheduler", f.scheduler, "Scheduler address host:port")->required();
  app.add_option("--tokenizer", f.tokenizer, "tokenizer.json, or the model directory holding it")->required();
  app.add_option("--scheduler-timeout-s", f.scheduler_timeout_s, "How long to wait for the scheduler at start");
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
  ferry::InitLogging("gateway", flags.service.log_level);

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
    options.limits.max_model_len = info.max_model_len();
    options.limits.vocab_size = info.vocab_size();
    const auto& d = info.generation_defaults();
    auto& defaults = options.limits.defaults;
    if (d.has_temperature()) defaults.temperature = d.temperature();
    if (d.has_top_p()) defaults.top_p = d.top_p();
    if (d.has_top_k()) defaults.top_k = d.top_k();
    if (d.has_min_p()) defaults.min_p = d.min_p();
    if (d.has_repetition_penalty()) defaults.repetition_penalty = d.repetition_penalty();
    spdlog::info("scheduler ready: model {}, max_model_len {}, vocab {}", info.model(), info.max_model_len(),
                 info.vocab_size());
  } catch (const std::exception& e) {
    spdlog::critical("{}", e.what());
    return 1;
  }

  ferry::MetricsServer metrics(flags.service.metrics_bind());
  ferry::gateway::Generator generator(*tokenizer, channel, options, metrics.registry());
  ferry::gateway::GenerationService service(generator);
  return ferry::ServeUntilSignal(flags.service, {&service}, metrics, std::chrono::seconds(5));
}
