#include "common/service_main.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#include "common/process.h"

namespace ferry {

void AddServiceFlags(CLI::App& app, ServiceFlags& f, TlsRole role) {
  app.add_option("--host", f.host, "Address to listen on");
  app.add_option("--port", f.port, "gRPC port (0: kernel chooses; see --ready-file)");
  app.add_option("--metrics-port", f.metrics_port, "Prometheus /metrics port (0: kernel chooses)");
  app.add_option("--ready-file", f.ready_file, "Write {grpc_port, metrics_port} here once serving");
  app.add_option("--log-level", f.log_level, "trace, debug, info, warn, error");
  app.add_option("--drain-grace-s", f.drain_grace_s, "On SIGTERM, how long in-flight calls may take to finish");
  AddTlsFlags(app, f.tls, role);
  app.parse_complete_callback([&f] {
    try {
      ValidateTlsFlags(f.tls);
    } catch (const std::invalid_argument& e) {
      throw CLI::ValidationError(e.what());
    }
  });
}

namespace {

// Keeps grpc.health.v1 in step with hooks.is_ready until stopped.
class HealthUpdater {
 public:
  HealthUpdater(grpc::HealthCheckServiceInterface* health, std::function<bool()> is_ready)
      : health_(health), is_ready_(std::move(is_ready)) {
    health_->SetServingStatus(kLivenessHealthService, true);
    thread_ = std::thread([this] { Loop(); });
  }
  ~HealthUpdater() { Stop(); }

  // From now on: NOT_SERVING, whatever is_ready says.
  void Stop() {
    {
      std::lock_guard lock(mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    cv_.notify_one();
    thread_.join();
    health_->SetServingStatus(false);  // every name, liveness included
  }

 private:
  void Loop() {
    std::unique_lock lock(mu_);
    while (!stopped_) {
      health_->SetServingStatus("", !is_ready_ || is_ready_());
      cv_.wait_for(lock, std::chrono::milliseconds(500), [&] { return stopped_; });
    }
  }

  grpc::HealthCheckServiceInterface* health_;
  std::function<bool()> is_ready_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
  std::thread thread_;
};

}  // namespace

int ServeUntilSignal(const ServiceFlags& flags, const std::vector<grpc::Service*>& services,
                     const MetricsServer& metrics, std::chrono::seconds grace, const ServeHooks& hooks) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(flags.host + ":" + std::to_string(flags.port), ServerCredentials(flags.tls), &port);
  builder.SetMaxReceiveMessageSize(64 << 20);
  for (grpc::Service* service : services) builder.RegisterService(service);
  auto server = builder.BuildAndStart();
  if (!server || port == 0) {
    spdlog::critical("cannot listen on {}:{}", flags.host, flags.port);
    return 1;
  }
  HealthUpdater health(server->GetHealthCheckService(), hooks.is_ready);
  spdlog::info("serving on {}:{} ({}), metrics on :{}", flags.host, port,
               !flags.tls.server_enabled()       ? "plaintext"
               : flags.tls.role == TlsRole::kPublic ? (flags.tls.client_ca.empty() ? "TLS" : "mutual TLS")
                                                    : "mutual TLS",
               metrics.port());
  WriteReadyFile(flags.ready_file, {{"grpc_port", port}, {"metrics_port", metrics.port()}});

  const int sig = WaitForShutdownSignal();
  const auto drain = flags.drain_grace_s >= 0 ? std::chrono::seconds(flags.drain_grace_s) : grace;
  spdlog::info("signal {}: draining (health NOT_SERVING, new calls refused, up to {} s for calls in flight)", sig,
               drain.count());
  health.Stop();
  const auto deadline = std::chrono::system_clock::now() + drain;
  std::thread other;
  if (hooks.drain) other = std::thread([&hooks, deadline] { hooks.drain(deadline); });
  server->Shutdown(deadline);
  if (other.joinable()) other.join();
  spdlog::info("drained; exiting");
  return 0;
}

}  // namespace ferry
