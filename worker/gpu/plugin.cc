// libferry-gpu.so: the GPU engine behind worker/gpu_plugin.h (why a plugin: see there).
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <thread>
#include <type_traits>

#include "worker/comm/nccl_communicator.h"
#include "worker/gpu/cuda_runner.h"
#include "worker/gpu/gpu_metrics.h"
#include "worker/gpu_plugin.h"

namespace ferry::worker::gpu {
namespace {

// Rank 0 creates the NCCL unique id and publishes it in the rendezvous directory (written to a
// temporary name, then renamed, so a reader never sees half of it); the others wait for it.
std::string ExchangeNcclId(const GpuPluginOptions& options) {
  namespace fs = std::filesystem;
  if (options.dist_store_dir.empty()) throw std::invalid_argument("--tensor-parallel-size > 1 needs --dist-store-dir");
  const fs::path path = fs::path(options.dist_store_dir) / "nccl_unique_id";
  if (options.engine.tp_rank == 0) {
    const std::string id = GetNcclUniqueId();
    const fs::path tmp = path.string() + ".tmp";
    std::ofstream(tmp, std::ios::binary).write(id.data(), static_cast<std::streamsize>(id.size()));
    fs::rename(tmp, path);
    return id;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!fs::exists(path)) {
    if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("no NCCL unique id at " + path.string());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The runner and its series, destroyed together (metrics first: they observe the runner).
class GpuRunnerWithMetrics final : public ModelRunner {
 public:
  GpuRunnerWithMetrics(const CudaRunnerOptions& options, prometheus::Registry& registry)
      : runner_(options), metrics_(runner_, registry) {}
  const ModelInfo& info() const override { return runner_.info(); }
  std::vector<SampledTokenOut> Step(const StepSpec& step) override { return runner_.Step(step); }
  bool healthy() const override { return runner_.healthy(); }
  void ForgetAll() override { runner_.ForgetAll(); }

 private:
  CudaQwen2Runner runner_;
  GpuMetrics metrics_;
};

}  // namespace
}  // namespace ferry::worker::gpu

extern "C" __attribute__((visibility("default"))) ferry::worker::ModelRunner* ferry_create_gpu_runner(
    const ferry::worker::GpuPluginOptions& options, prometheus::Registry& registry, std::string* error) {
  try {
    ferry::worker::gpu::CudaRunnerOptions o = options.engine;
    if (o.tp_size > 1) o.nccl_unique_id = ferry::worker::gpu::ExchangeNcclId(options);
    return new ferry::worker::gpu::GpuRunnerWithMetrics(o, registry);
  } catch (const std::exception& e) {
    if (error) *error = e.what();
    return nullptr;
  }
}

static_assert(std::is_same_v<decltype(&ferry_create_gpu_runner), ferry::worker::CreateGpuRunnerFn>,
              "the plugin's entry point must match worker/gpu_plugin.h");
