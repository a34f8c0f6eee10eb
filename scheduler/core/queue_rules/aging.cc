// aging: each full interval a request has waited since its arrival raises its priority by one
// (SchedulerConfig::aging_interval_ms; ferry-scheduler's --aging-interval-ms), so a low-priority request
// is not starved by a steady stream of higher ones.
#include <chrono>

#include "scheduler/core/queue_rules/rules.h"
#include "scheduler/core/sequence.h"

namespace ferry::scheduler {
namespace {

class Aging final : public QueueRule {
 public:
  explicit Aging(int32_t interval_ms) : interval_ms_(interval_ms) {}
  int64_t Boost(const Sequence& seq, TimePoint now) const override {
    if (now <= seq.spec.arrival) return 0;
    return std::chrono::duration_cast<std::chrono::milliseconds>(now - seq.spec.arrival).count() / interval_ms_;
  }

 private:
  int32_t interval_ms_;  // > 0
};

}  // namespace

bool AgingEnabled(const SchedulerConfig& config) { return config.aging_interval_ms > 0; }

std::unique_ptr<QueueRule> MakeAging(const SchedulerConfig& config) {
  return std::make_unique<Aging>(config.aging_interval_ms);
}

}  // namespace ferry::scheduler
