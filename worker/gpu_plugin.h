// The GPU engine as a plugin: ferry-worker loads libferry-gpu.so with dlopen, and only for
// --device cuda. Two reasons:
// - cuBLASLt carries more thread-local storage than the stack civetweb (prometheus-cpp's
//   /metrics server) gives its threads, so a worker linked against it at start cannot serve
//   /metrics (pthread_create fails, "null context when constructing CivetServer"). A library
//   loaded with dlopen gets its TLS allocated on demand instead.
// - The CPU worker needs no CUDA library on the machine at all.
// The interface is plain C++ (same compiler and libstdc++ on both sides, built together).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "worker/engine/model_runner.h"
#include "worker/gpu/cuda_runner_options.h"

namespace prometheus {
class Registry;
}

namespace ferry::worker {

struct GpuPluginOptions {
  gpu::CudaRunnerOptions engine;  // nccl_unique_id is filled by the plugin from dist_store_dir
  std::string dist_store_dir;     // NCCL unique id rendezvous when engine.tp_size > 1
};

// The plugin's one entry point: a runner with its Prometheus series registered in `registry`
// (which outlives it), or nullptr with `*error` set.
using CreateGpuRunnerFn = ModelRunner* (*)(const GpuPluginOptions& options, prometheus::Registry& registry,
                                           std::string* error);
inline constexpr char kCreateGpuRunnerSymbol[] = "ferry_create_gpu_runner";
inline constexpr char kGpuPluginFile[] = "libferry-gpu.so";

// Loads the plugin (never unloaded) and creates the runner. `plugin_path` empty: kGpuPluginFile
// beside the running executable. Throws std::runtime_error naming the file and the reason.
std::unique_ptr<ModelRunner> LoadGpuRunner(const std::string& plugin_path, const GpuPluginOptions& options,
                                           prometheus::Registry& registry);

}  // namespace ferry::worker
