// The scheduler's Prometheus series. Owned by the engine loop, touched only by its thread.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <string>

#include "scheduler/core/types.h"

namespace ferry::scheduler {

struct LoopMetrics {
  LoopMetrics(prometheus::Registry& r, int32_t num_ranks);

  // A kind's series is looked up once (Family::Add builds a label map): an end allocates nothing after.
  void Finished(FinishKind kind) {
    prometheus::Counter*& counter = finished_by_kind_[static_cast<size_t>(kind)];
    if (counter == nullptr) counter = &finished.Add({{"reason", FinishKindName(kind)}});
    counter->Increment();
  }
  // Exactly one level series is 1 at a time.
  void SetLevel(const std::string& level) { SetOneHot(level_series, "level", current_level_, level); }
  // The controller's regime (ControllerStatus::regime), one series at 1.
  void SetRegime(const std::string& regime) { SetOneHot(regime_series, "regime", current_regime_, regime); }
  // vLLM's lora_requests_info: one series at 1, its labels the adapters running and waiting
  // (comma-separated, sorted) and max_lora; replaced when they change, so there is never more than
  // one (vLLM's value is the time of the change, for a reader that must pick the latest of several).
  void SetLoraInfo(const std::string& running, const std::string& waiting, int32_t max_lora);

  prometheus::Family<prometheus::Gauge>& requests;
  prometheus::Gauge& running;
  prometheus::Gauge& waiting;
  prometheus::Family<prometheus::Gauge>& blocks;
  prometheus::Gauge& blocks_used;
  prometheus::Gauge& blocks_free;
  prometheus::Gauge& kv_usage;
  prometheus::Family<prometheus::Counter>& finished;
  prometheus::Counter& steps;
  prometheus::Histogram& step_seconds;
  prometheus::Histogram& step_sequences;
  prometheus::Histogram& step_tokens;
  prometheus::Counter& scheduled_tokens;
  prometheus::Gauge& max_num_seqs;
  prometheus::Family<prometheus::Gauge>& level_series;
  prometheus::Family<prometheus::Gauge>& regime_series;
  prometheus::Family<prometheus::Counter>& cap_changes;
  prometheus::Counter& preemptions;
  prometheus::Counter& prefix_queries;
  prometheus::Counter& prefix_hits;
  // A lost worker group (#27): losses by reason, ranks back with a new incarnation, requests kept
  // and resumed or ended kUnavailable, time from loss to serving, and whether it is lost now.
  prometheus::Family<prometheus::Counter>& worker_losses;
  prometheus::Family<prometheus::Counter>& worker_restarts;
  prometheus::Counter& requests_resumed;
  prometheus::Counter& requests_failed_by_loss;
  prometheus::Histogram& recovery_seconds;
  prometheus::Gauge& recovering;
  prometheus::Family<prometheus::Gauge>& lora_info;

 private:
  static void SetOneHot(prometheus::Family<prometheus::Gauge>& family, const char* label, std::string& current,
                        const std::string& name);
  std::string current_level_;
  std::string current_regime_;
  prometheus::Gauge* lora_series_ = nullptr;
  std::string lora_running_, lora_waiting_;
  std::array<prometheus::Counter*, static_cast<size_t>(FinishKind::kNotFound) + 1> finished_by_kind_{};
};

}  // namespace ferry::scheduler
