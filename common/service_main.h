// What every Ferry service's main shares: the listen/metrics/ready-file flags,
// and serving until SIGTERM/SIGINT.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>

#include "common/metrics.h"

namespace ferry {

struct ServiceFlags {
  std::string host = "127.0.0.1";
  int port = 0;
  int metrics_port = 0;
  std::string ready_file;
  std::string log_level = "info";

  std::string metrics_bind() const { return host + ":" + std::to_string(metrics_port); }
};

void AddServiceFlags(CLI::App& app, ServiceFlags& flags);

// Serves services on flags.host:flags.port, writes the ready file
// ({grpc_port, metrics_port}), blocks until SIGTERM or SIGINT, then shuts down
// giving in-flight calls `grace`. Returns the process exit code.
int ServeUntilSignal(const ServiceFlags& flags, const std::vector<grpc::Service*>& services,
                     const MetricsServer& metrics, std::chrono::seconds grace);

}  // namespace ferry
