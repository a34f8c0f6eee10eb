#include "worker/device_metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <stdexcept>
#include <string>

#include <spdlog/spdlog.h>

namespace ferry::worker {

BusyWindow::BusyWindow(Clock::duration window, Clock::time_point start) : window_(window), last_(start) {
  points_.emplace_back(start, Clock::duration{0});
}

// Every time comes from the steady clock, read under DeviceMetrics' lock, so each is at or after
// the one before: no interval is negative and the busy time in a window never exceeds it. A time
// that goes back is a caller's bug, reported, not clamped away (issue #53: the clamps that stood
// here made the catalogue test's [0, 1] bound on the ratio one that could not fail).
void BusyWindow::Advance(Clock::time_point t) {
  if (t < last_) throw std::logic_error("BusyWindow: a time before the previous one");
  last_ = t;
}

void BusyWindow::Begin(Clock::time_point t) {
  Advance(t);
  if (!begun_) begun_ = t;
}

void BusyWindow::End(Clock::time_point t) {
  Advance(t);
  if (!begun_) return;
  busy_ += t - *begun_;
  begun_.reset();
}

double BusyWindow::Ratio(Clock::time_point now) {
  Advance(now);
  const Clock::duration busy = busy_ + (begun_ ? now - *begun_ : Clock::duration{0});
  points_.emplace_back(now, busy);
  // Keep the newest point at or before now - window as the base: the ratio covers at least the window.
  while (points_.size() > 2 && points_[1].first <= now - window_) points_.pop_front();
  const auto& [since, busy_then] = points_.front();
  const auto elapsed = std::chrono::duration<double>(now - since).count();
  if (elapsed <= 0) return 0;
  return std::chrono::duration<double>(busy - busy_then).count() / elapsed;
}

uint64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size_pages = 0, resident_pages = 0;
  if (!(statm >> size_pages >> resident_pages)) return 0;
  return resident_pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

uint64_t AvailableMemoryBytes() {
  const uint64_t physical = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  // cgroup v2: "max" or a number of bytes.
  std::ifstream limit_file("/sys/fs/cgroup/memory.max");
  std::string limit;
  if (limit_file >> limit && !limit.empty() && std::all_of(limit.begin(), limit.end(), [](unsigned char c) { return std::isdigit(c) != 0; })) {
    return std::min(physical, static_cast<uint64_t>(std::stoull(limit)));
  }
  return physical;
}

struct DeviceMetrics::Gpu {
  std::unique_ptr<Nvml> nvml;
  int index;
  prometheus::Gauge& utilization;
  prometheus::Gauge& memory_used;
  prometheus::Gauge& memory_total;
};

DeviceMetrics::DeviceMetrics(prometheus::Registry& registry, DeviceMetricsOptions options)
    : options_(std::move(options)),
      busy_ratio_(prometheus::BuildGauge()
                      .Name("ferry_worker_engine_busy_ratio")
                      .Help("Share of the last seconds this worker spent executing steps")
                      .Register(registry)
                      .Add({})),
      memory_used_(prometheus::BuildGauge()
                       .Name("ferry_worker_device_memory_used_bytes")
                       .Help("Device memory in use: this process's resident memory (cpu), NVML's used (gpuN)")
                       .Register(registry)),
      memory_total_(prometheus::BuildGauge()
                        .Name("ferry_worker_device_memory_total_bytes")
                        .Help("Device memory: physical or cgroup-limited memory (cpu), NVML's total (gpuN)")
                        .Register(registry)),
      cpu_memory_used_(memory_used_.Add({{"device", "cpu"}})),
      cpu_memory_total_(memory_total_.Add({{"device", "cpu"}})),
      busy_(options_.busy_window, BusyWindow::Clock::now()) {
  if (auto nvml = Nvml::Load(options_.nvml_library)) {
    const int count = nvml->num_devices();
    if (count > 0) {
      const int index = options_.gpu_index % count;
      const prometheus::Labels device{{"device", "gpu" + std::to_string(index)}};
      auto& utilization = prometheus::BuildGauge()
                              .Name("ferry_worker_device_utilization_ratio")
                              .Help("Share of NVML's last sample period a kernel ran on the GPU (GPU only)")
                              .Register(registry)
                              .Add(device);
      gpu_.reset(new Gpu{std::move(nvml), index, utilization, memory_used_.Add(device), memory_total_.Add(device)});
      spdlog::info("NVML: reporting GPU {} of {}", index, count);
    } else {
      spdlog::info("NVML loaded but sees no GPU: no GPU metrics");
    }
  }
  Sample();
  sampler_ = std::thread([this] { Loop(); });
}

DeviceMetrics::~DeviceMetrics() {
  {
    std::lock_guard lock(mu_);
    stopped_ = true;
  }
  cv_.notify_one();
  sampler_.join();
}

void DeviceMetrics::StepBegan() {
  std::lock_guard lock(mu_);
  busy_.Begin(BusyWindow::Clock::now());
}

void DeviceMetrics::StepEnded() {
  std::lock_guard lock(mu_);
  busy_.End(BusyWindow::Clock::now());
}

void DeviceMetrics::Sample() {
  {
    std::lock_guard lock(mu_);
    busy_ratio_.Set(busy_.Ratio(BusyWindow::Clock::now()));
  }
  cpu_memory_used_.Set(static_cast<double>(ResidentBytes()));
  cpu_memory_total_.Set(static_cast<double>(AvailableMemoryBytes()));
  if (gpu_) {
    if (auto sample = gpu_->nvml->Sample(gpu_->index)) {
      gpu_->utilization.Set(sample->utilization_ratio);
      gpu_->memory_used.Set(static_cast<double>(sample->memory_used_bytes));
      gpu_->memory_total.Set(static_cast<double>(sample->memory_total_bytes));
    }
  }
}

void DeviceMetrics::Loop() {
  std::unique_lock lock(mu_);
  while (!cv_.wait_for(lock, options_.sample_period, [this] { return stopped_; })) {
    lock.unlock();
    Sample();
    lock.lock();
  }
}

}  // namespace ferry::worker
