// late-last: a request still waiting past its first-token target (RequestSpec::first_token_target: its
// lane's SchedulerConfig::lane_ttft; ferry-scheduler's --serve-late-last and --lane-ttft-ms) goes after
// every request that can still meet its own, of any priority, and preempts none. In an overload, first
// come, first served spends every seat on requests that are already late; this way the newest still make
// it (docs/benchmarks/scheduler.md 7g). Of any priority: a late request counts for nothing whatever its
// lane, an on-time batch request still can; within its priority only, cap 1 spent an interactive lane's
// lulls on its late backlog while the batch lane missed its target (scheduler.md section 8). A request whose prefill no longer fits in the time it has left is
// late too: its first token comes after its prompt is computed (the prompt's tokens at the cost the
// step fit measures; the prefix cache's share is not known before admission, so all of them). Started,
// the oldest on-time request missed by its own prefill: on the CPU engine, where a 600-token prompt takes
// 1.2 s, 27 of 169 misses at cap 1 on one overloaded trace (scheduler.md section 8).
#include <chrono>

#include "scheduler/core/queue_rules/rules.h"
#include "scheduler/core/sequence.h"

namespace ferry::scheduler {
namespace {

class LateLast final : public QueueRule {
 public:
  bool Defers(const Sequence& seq, TimePoint now) const override {
    if (seq.is_sent || seconds_per_token_ <= 0 || seq.spec.first_token_target == TimePoint::max()) {
      return seq.IsLate(now);
    }
    const double tokens = static_cast<double>(seq.spec.prompt.size() + seq.spec.generated.size());
    const auto prefill = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(seconds_per_token_ * tokens));
    return seq.spec.first_token_target - now < prefill;
  }
  bool can_defer() const override { return true; }
  void SetPrefillSecondsPerToken(double seconds) override { seconds_per_token_ = seconds; }

 private:
  double seconds_per_token_ = 0;
};

}  // namespace

bool LateLastEnabled(const SchedulerConfig& config) { return config.serve_late_last; }

std::unique_ptr<QueueRule> MakeLateLast(const SchedulerConfig&) { return std::make_unique<LateLast>(); }

}  // namespace ferry::scheduler
