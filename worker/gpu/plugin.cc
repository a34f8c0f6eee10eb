// libferry-gpu.so: the GPU engine behind worker/gpu_plugin.h (why a plugin: see there).
#include <cuda_runtime_api.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <type_traits>

#include "worker/comm/nccl_communicator.h"
#include "worker/engine/forwarding_runner.h"
#include "worker/comm/rendezvous.h"
#include "worker/gpu/cuda_runner.h"
#include "worker/gpu/gpu_metrics.h"
#include "worker/gpu_plugin.h"

namespace ferry::worker::gpu {
namespace {

// Rank 0 creates the NCCL unique id and serves it from a RendezvousHost (worker/comm/rendezvous.h)
// until the group has formed; the others fetch it. A file alone would outlive rank 0, and a
// restarted rank would join with a dead incarnation's id.
std::string ExchangeNcclId(const GpuPluginOptions& options, std::unique_ptr<RendezvousHost>* host) {
  if (options.dist_store_dir.empty()) throw std::invalid_argument("--tensor-parallel-size > 1 needs --dist-store-dir");
  const std::filesystem::path dir = options.dist_store_dir;
  if (options.engine.tp_rank == 0) {
    const std::string id = GetNcclUniqueId();
    // Loopback: the NCCL group is one machine's GPUs (one rank per device).
    *host = std::make_unique<RendezvousHost>(dir, "nccl_unique_id", "127.0.0.1", id);
    return id;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(options.engine.dist_timeout_s);
  return FetchFromRendezvousHost(dir, "nccl_unique_id", deadline);
}

// The runner and its series, destroyed together (metrics first: they observe the runner). The
// whole contract is forwarded (overlap included), and every call that drives the runner first
// makes its device current on the calling thread: steps come on gRPC threads, where device 0 is
// current, and rank N of a tensor-parallel group (every GPU visible) runs on device N.
class GpuRunnerWithMetrics final : public ForwardingRunner {
 public:
  GpuRunnerWithMetrics(const CudaRunnerOptions& options, prometheus::Registry& registry)
      : ForwardingRunner(runner_), device_(options.device), runner_(options), metrics_(runner_, registry) {}
  // The runner frees its device memory and stream on the destroying thread: on its device too.
  ~GpuRunnerWithMetrics() override { cudaSetDevice(device_); }

 protected:
  void Enter() const override { FERRY_CUDA_CHECK(cudaSetDevice(device_)); }

 private:
  const int device_;
  CudaRunner runner_;
  GpuMetrics metrics_;
};

}  // namespace
}  // namespace ferry::worker::gpu

extern "C" __attribute__((visibility("default"))) ferry::worker::ModelRunner* ferry_create_gpu_runner(
    const ferry::worker::GpuPluginOptions& options, prometheus::Registry& registry, std::string* error) {
  try {
    ferry::worker::gpu::CudaRunnerOptions o = options.engine;
    std::unique_ptr<ferry::worker::RendezvousHost> host;  // rank 0: serves the id until NCCL init returns
    if (o.tp_size > 1) o.nccl_unique_id = ferry::worker::gpu::ExchangeNcclId(options, &host);
    return new ferry::worker::gpu::GpuRunnerWithMetrics(o, registry);
  } catch (const std::exception& e) {
    if (error) *error = e.what();
    return nullptr;
  }
}

static_assert(std::is_same_v<decltype(&ferry_create_gpu_runner), ferry::worker::CreateGpuRunnerFn>,
              "the plugin's entry point must match worker/gpu_plugin.h");
