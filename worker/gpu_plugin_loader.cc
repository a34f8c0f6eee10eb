#include <dlfcn.h>

#include <filesystem>
#include <stdexcept>

#include "worker/gpu_plugin.h"

namespace ferry::worker {

std::unique_ptr<ModelRunner> LoadGpuRunner(const std::string& plugin_path, const GpuPluginOptions& options,
                                           prometheus::Registry& registry) {
  std::string path = plugin_path;
  if (path.empty()) {
    std::error_code ec;
    const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    path = ((ec ? std::filesystem::path(".") : exe.parent_path()) / kGpuPluginFile).string();
  }
  // Kept loaded for the life of the process: the runner's code and vtable live in it.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    throw std::runtime_error("--device cuda: cannot load the GPU engine " + path + ": " + (why ? why : "?") +
                             " (built only where CUDA is; see worker/gpu/README.md)");
  }
  auto create = reinterpret_cast<CreateGpuRunnerFn>(dlsym(handle, kCreateGpuRunnerSymbol));
  if (create == nullptr) {
    throw std::runtime_error("--device cuda: " + path + " has no " + kCreateGpuRunnerSymbol);
  }
  std::string error;
  std::unique_ptr<ModelRunner> runner(create(options, registry, &error));
  if (!runner) throw std::runtime_error(error.empty() ? "the GPU engine failed to start" : error);
  return runner;
}

}  // namespace ferry::worker
