// NVIDIA's management library (NVML), loaded at run time: the worker builds and runs where no
// driver is installed, and reads GPU utilisation and memory where one is. Only the handful of
// functions the device metrics need are declared (their ABI has been stable since NVML 5).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace ferry::worker {

struct GpuSample {
  double utilization_ratio = 0;  // share of the last sample period a kernel ran, 0..1
  uint64_t memory_used_bytes = 0;
  uint64_t memory_total_bytes = 0;
};

class Nvml {
 public:
  static constexpr char kDefaultLibrary[] = "libnvidia-ml.so.1";

  // nullptr when the library cannot be loaded, lacks a function, or nvmlInit fails (no driver,
  // no device): the caller then exports no GPU series.
  static std::unique_ptr<Nvml> Load(const std::string& library = kDefaultLibrary);
  ~Nvml();  // nvmlShutdown, then dlclose
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  int num_devices() const;
  // nullopt when the device does not answer (e.g. it fell off the bus).
  std::optional<GpuSample> Sample(int index) const;

 private:
  struct Api;
  Nvml(void* handle, std::unique_ptr<Api> api);

  void* handle_;
  std::unique_ptr<Api> api_;
};

}  // namespace ferry::worker
