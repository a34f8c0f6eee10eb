// The worker's device gauges, sampled on a thread of their own so that they stay true while
// the engine is idle:
//   ferry_worker_engine_busy_ratio                   share of the last busy_window spent in steps
//   ferry_worker_device_memory_used_bytes{device}    "cpu": this process's resident memory;
//   ferry_worker_device_memory_total_bytes{device}     "gpuN": NVML's used/total (GPU only)
//   ferry_worker_device_utilization_ratio{device}    "gpuN" only: NVML's utilisation
// GPU series exist only where NVML loads (worker/nvml.h); the worker reads GPU
// gpu_index % (GPUs it can see): its own GPU both in a container that sees only it and on a host
// where rank r uses GPU r (NVML numbers GPUs in PCI order; CUDA does too with
// CUDA_DEVICE_ORDER=PCI_BUS_ID).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include "worker/nvml.h"

namespace ferry::worker {

// Share of the trailing window spent between Begin and End, a step still running included.
// Not thread-safe; DeviceMetrics serialises it.
class BusyWindow {
 public:
  using Clock = std::chrono::steady_clock;

  BusyWindow(Clock::duration window, Clock::time_point start);
  void Begin(Clock::time_point t);
  void End(Clock::time_point t);
  // The ratio over about the last window (at least window, at most window plus the gap between
  // two calls), in [0, 1]. Each call records a point the next calls measure from.
  double Ratio(Clock::time_point now);
  // Each call's time must be at or after the previous call's (and the start): std::logic_error.

 private:
  void Advance(Clock::time_point t);
  Clock::duration window_;
  Clock::duration busy_{0};  // steps that ended
  std::optional<Clock::time_point> begun_;
  Clock::time_point last_;  // the latest time given
  std::deque<std::pair<Clock::time_point, Clock::duration>> points_;  // (time, busy until then)
};

struct DeviceMetricsOptions {
  int gpu_index = 0;  // the worker's GPU: --cuda-device, else its tensor-parallel rank
  std::chrono::milliseconds sample_period{1000};
  std::chrono::seconds busy_window{10};
  std::string nvml_library = Nvml::kDefaultLibrary;
};

// Bytes of this process resident in memory, and the memory it may use (the cgroup's limit
// when one is set and smaller than the machine's).
uint64_t ResidentBytes();
uint64_t AvailableMemoryBytes();

class DeviceMetrics {
 public:
  DeviceMetrics(prometheus::Registry& registry, DeviceMetricsOptions options);
  ~DeviceMetrics();  // stops the sampler

  // Called by the step thread around each step.
  void StepBegan();
  void StepEnded();
  // Updates every gauge now (the sampler calls it each period).
  void Sample();
  bool has_gpu() const { return gpu_ != nullptr; }

 private:
  struct Gpu;
  void Loop();

  const DeviceMetricsOptions options_;
  prometheus::Gauge& busy_ratio_;
  prometheus::Family<prometheus::Gauge>& memory_used_;
  prometheus::Family<prometheus::Gauge>& memory_total_;
  prometheus::Gauge& cpu_memory_used_;
  prometheus::Gauge& cpu_memory_total_;
  std::unique_ptr<Gpu> gpu_;  // null without NVML

  std::mutex mu_;  // guards busy_ and stopped_
  BusyWindow busy_;
  bool stopped_ = false;
  std::condition_variable cv_;
  std::thread sampler_;
};

}  // namespace ferry::worker
