#include "worker/gpu/gpu_metrics.h"

namespace ferry::worker::gpu {
namespace {

prometheus::Histogram::BucketBoundaries StepBuckets() {
  return {0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048};
}

}  // namespace

GpuMetrics::GpuMetrics(CudaRunner& runner, prometheus::Registry& registry) : runner_(runner) {
  auto& step = prometheus::BuildHistogram().Name("ferry_worker_gpu_step_seconds")
                   .Help("Device time of one engine step, by phase").Register(registry);
  step_decode_ = &step.Add({{"phase", "decode"}}, StepBuckets());
  step_prefill_ = &step.Add({{"phase", "prefill"}}, StepBuckets());
  step_mixed_ = &step.Add({{"phase", "mixed"}}, StepBuckets());
  busy_seconds_ = &prometheus::BuildCounter().Name("ferry_worker_gpu_busy_seconds_total")
                       .Help("Device time spent executing engine steps").Register(registry).Add({});
  graph_steps_ = &prometheus::BuildCounter().Name("ferry_worker_cuda_graph_steps_total")
                      .Help("Engine steps replayed from a captured CUDA graph").Register(registry).Add({});
  host_sampled_rows_ = &prometheus::BuildCounter().Name("ferry_worker_gpu_host_sampled_rows_total")
                            .Help("Rows sampled on the host because the device sampler's entry capacity was full")
                            .Register(registry).Add({});
  healthy_ = &prometheus::BuildGauge().Name("ferry_worker_gpu_healthy")
                  .Help("1 while the GPU runner is healthy; 0 after a sticky device error or a hung step")
                  .Register(registry).Add({});
  healthy_->Set(1);
  runner_.set_step_observer([this](const StepTiming& t) { OnStep(t); });
}

GpuMetrics::~GpuMetrics() { runner_.set_step_observer(nullptr); }

// Runs on the step thread after each step, failed ones included (gpu_seconds 0 then).
void GpuMetrics::OnStep(const StepTiming& t) {
  healthy_->Set(runner_.healthy() ? 1 : 0);
  if (t.gpu_seconds <= 0) return;
  prometheus::Histogram* h = t.phase == StepTiming::Phase::kDecode    ? step_decode_
                             : t.phase == StepTiming::Phase::kPrefill ? step_prefill_
                                                                      : step_mixed_;
  h->Observe(t.gpu_seconds);
  busy_seconds_->Increment(t.gpu_seconds);
  if (t.graph) graph_steps_->Increment();
  if (t.host_sampled_rows > 0) host_sampled_rows_->Increment(t.host_sampled_rows);
}

}  // namespace ferry::worker::gpu
