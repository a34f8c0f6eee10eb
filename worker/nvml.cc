#include "worker/nvml.h"

#include <dlfcn.h>

#include <spdlog/spdlog.h>

namespace ferry::worker {

namespace {

// The C declarations from nvml.h that Ferry uses. nvmlReturn_t is an enum (int); 0 is success.
using NvmlReturn = int;
using NvmlDevice = struct NvmlDeviceOpaque*;
struct NvmlUtilization {
  unsigned int gpu;     // percent of the sample period a kernel was running
  unsigned int memory;  // percent of the sample period device memory was read or written
};
struct NvmlMemory {
  unsigned long long total;  // bytes
  unsigned long long free;
  unsigned long long used;
};
constexpr NvmlReturn kNvmlSuccess = 0;

template <typename Fn>
bool Resolve(void* handle, const char* name, Fn*& out) {
  out = reinterpret_cast<Fn*>(dlsym(handle, name));
  if (out == nullptr) spdlog::warn("NVML: {} is missing from the library; no GPU metrics", name);
  return out != nullptr;
}

}  // namespace

struct Nvml::Api {
  NvmlReturn (*init)();
  NvmlReturn (*shutdown)();
  NvmlReturn (*device_count)(unsigned int*);
  NvmlReturn (*device_by_index)(unsigned int, NvmlDevice*);
  NvmlReturn (*utilization)(NvmlDevice, NvmlUtilization*);
  NvmlReturn (*memory)(NvmlDevice, NvmlMemory*);
};

std::unique_ptr<Nvml> Nvml::Load(const std::string& library) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    spdlog::info("NVML not loaded ({}): no GPU metrics", dlerror());
    return nullptr;
  }
  auto api = std::make_unique<Api>();
  const bool complete = Resolve(handle, "nvmlInit_v2", api->init) && Resolve(handle, "nvmlShutdown", api->shutdown) &&
                        Resolve(handle, "nvmlDeviceGetCount_v2", api->device_count) &&
                        Resolve(handle, "nvmlDeviceGetHandleByIndex_v2", api->device_by_index) &&
                        Resolve(handle, "nvmlDeviceGetUtilizationRates", api->utilization) &&
                        Resolve(handle, "nvmlDeviceGetMemoryInfo", api->memory);
  if (!complete) {
    dlclose(handle);
    return nullptr;
  }
  if (const NvmlReturn rc = api->init(); rc != kNvmlSuccess) {
    spdlog::info("NVML present but nvmlInit failed ({}): no GPU metrics", rc);
    dlclose(handle);
    return nullptr;
  }
  return std::unique_ptr<Nvml>(new Nvml(handle, std::move(api)));
}

Nvml::Nvml(void* handle, std::unique_ptr<Api> api) : handle_(handle), api_(std::move(api)) {}

Nvml::~Nvml() {
  api_->shutdown();
  dlclose(handle_);
}

int Nvml::num_devices() const {
  unsigned int count = 0;
  return api_->device_count(&count) == kNvmlSuccess ? static_cast<int>(count) : 0;
}

std::optional<GpuSample> Nvml::Sample(int index) const {
  NvmlDevice device = nullptr;
  NvmlUtilization utilization{};
  NvmlMemory memory{};
  if (index < 0 || api_->device_by_index(static_cast<unsigned int>(index), &device) != kNvmlSuccess ||
      api_->utilization(device, &utilization) != kNvmlSuccess || api_->memory(device, &memory) != kNvmlSuccess) {
    return std::nullopt;
  }
  return GpuSample{utilization.gpu / 100.0, memory.used, memory.total};
}

}  // namespace ferry::worker
