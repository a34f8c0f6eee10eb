// The GPU engine's own Prometheus series, next to the worker's generic ones (worker_service.cc)
// and device gauges (worker/device_metrics.h: busy ratio over wall time, NVML utilisation and
// memory):
//   ferry_worker_gpu_step_seconds{phase="decode|prefill|mixed"}  device time per step
//   ferry_worker_gpu_busy_seconds_total     device time executing steps (rate() of it is the
//                                           device-side busy ratio)
//   ferry_worker_cuda_graph_steps_total     steps replayed from a captured CUDA graph
//   ferry_worker_gpu_host_sampled_rows_total  rows sampled by the CPU Sampler because the device
//                                           sampler's entry capacity (sampler_max_entries) was full
//   ferry_worker_gpu_healthy                1 while the runner is healthy (read at scrape time)
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>

#include "worker/gpu/cuda_runner.h"

namespace ferry::worker::gpu {

class GpuMetrics {
 public:
  // Registers the series and hooks the runner's step observer; `runner` outlives this.
  GpuMetrics(CudaRunner& runner, prometheus::Registry& registry);
  ~GpuMetrics();
  GpuMetrics(const GpuMetrics&) = delete;
  GpuMetrics& operator=(const GpuMetrics&) = delete;

 private:
  void OnStep(const StepTiming& timing);

  CudaRunner& runner_;
  prometheus::Histogram* step_decode_;
  prometheus::Histogram* step_prefill_;
  prometheus::Histogram* step_mixed_;
  prometheus::Counter* busy_seconds_;
  prometheus::Counter* graph_steps_;
  prometheus::Counter* host_sampled_rows_;
  prometheus::Gauge* healthy_;
};

}  // namespace ferry::worker::gpu
