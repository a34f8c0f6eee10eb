// What every Ferry service's main shares: the listen/metrics/ready-file flags,
// and serving until SIGTERM/SIGINT with grpc.health.v1, server reflection and a
// graceful drain.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>

#include "common/metrics.h"
#include "common/tls.h"

namespace ferry {

struct ServiceFlags {
  std::string host = "127.0.0.1";
  int port = 0;
  int metrics_port = 0;
  std::string ready_file;
  std::string log_level = "info";
  int drain_grace_s = -1;  // -1: the service's own default (the grace passed to ServeUntilSignal)
  TlsFlags tls;            // the listener's TLS, and the service's identity on the hops it calls

  std::string metrics_bind() const { return host + ":" + std::to_string(metrics_port); }
};

// The flags above, TLS's included (common/tls.h), checked once parsing completes: a bad TLS
// combination fails the parse naming the flag.
void AddServiceFlags(CLI::App& app, ServiceFlags& flags, TlsRole role = TlsRole::kInternal);

// grpc.health.v1 names every service answers: "" (readiness: SERVING only while the path behind
// the service is ready, see ServeHooks) and kLivenessHealthService (SERVING while the process
// serves at all, whatever is behind it; for liveness probes, which must not restart a gateway
// because a scheduler is down). Both go NOT_SERVING when the drain starts.
inline constexpr char kLivenessHealthService[] = "liveness";

struct ServeHooks {
  // Whether the whole path behind this service is ready; grpc.health.v1 reports SERVING only
  // while it is true (polled every 500 ms). Unset: always ready.
  std::function<bool()> is_ready;
  // Drains what the service serves besides its gRPC server (the gateway's HTTP front), by the
  // same deadline; runs beside the gRPC server's own drain. Unset: nothing else.
  std::function<void(std::chrono::system_clock::time_point deadline)> drain;
};

// Serves services on flags.host:flags.port with grpc.health.v1 and reflection, writes the
// ready file ({grpc_port, metrics_port}), blocks until SIGTERM or SIGINT, then drains: health
// goes NOT_SERVING, new calls are refused, in-flight calls get up to flags.drain_grace_s to
// finish (flags.drain_grace_s, or `grace` when that is unset). Returns the process exit code
// (0 after a clean drain).
int ServeUntilSignal(const ServiceFlags& flags, const std::vector<grpc::Service*>& services,
                     const MetricsServer& metrics, std::chrono::seconds grace, const ServeHooks& hooks = {});

}  // namespace ferry
