#include "common/service_main.h"

#include <spdlog/spdlog.h>

#include "common/process.h"

namespace ferry {

void AddServiceFlags(CLI::App& app, ServiceFlags& f) {
  app.add_option("--host", f.host, "Address to listen on");
  app.add_option("--port", f.port, "gRPC port (0: kernel chooses; see --ready-file)");
  app.add_option("--metrics-port", f.metrics_port, "Prometheus /metrics port (0: kernel chooses)");
  app.add_option("--ready-file", f.ready_file, "Write {grpc_port, metrics_port} here once serving");
  app.add_option("--log-level", f.log_level, "trace, debug, info, warn, error");
}

int ServeUntilSignal(const ServiceFlags& flags, const std::vector<grpc::Service*>& services,
                     const MetricsServer& metrics, std::chrono::seconds grace) {
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(flags.host + ":" + std::to_string(flags.port), grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(64 << 20);
  for (grpc::Service* service : services) builder.RegisterService(service);
  auto server = builder.BuildAndStart();
  if (!server || port == 0) {
    spdlog::critical("cannot listen on {}:{}", flags.host, flags.port);
    return 1;
  }
  spdlog::info("serving on {}:{}, metrics on :{}", flags.host, port, metrics.port());
  WriteReadyFile(flags.ready_file, {{"grpc_port", port}, {"metrics_port", metrics.port()}});

  const int sig = WaitForShutdownSignal();
  spdlog::info("signal {}: shutting down", sig);
  server->Shutdown(std::chrono::system_clock::now() + grace);
  return 0;
}

}  // namespace ferry
