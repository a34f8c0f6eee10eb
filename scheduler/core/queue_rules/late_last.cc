// late-last: within its priority, a request still waiting past its first-token target (RequestSpec::
// first_token_target: its lane's SchedulerConfig::lane_ttft; ferry-scheduler's --serve-late-last and
// --lane-ttft-ms) goes after those that can still meet theirs. In an overload, first come, first served
// spends every seat on requests that are already late; this way the newest still make it
// (docs/benchmarks/scheduler.md 7g).
#include "scheduler/core/queue_rules/rules.h"
#include "scheduler/core/sequence.h"

namespace ferry::scheduler {
namespace {

class LateLast final : public QueueRule {
 public:
  bool Defers(const Sequence& seq, TimePoint now) const override { return seq.IsLate(now); }
  bool can_defer() const override { return true; }
};

}  // namespace

bool LateLastEnabled(const SchedulerConfig& config) { return config.serve_late_last; }

std::unique_ptr<QueueRule> MakeLateLast(const SchedulerConfig&) { return std::make_unique<LateLast>(); }

}  // namespace ferry::scheduler
