#include "scheduler/core/queue_order.h"

#include <array>
#include <utility>

#include "scheduler/core/queue_rules/rules.h"
#include "scheduler/core/sequence.h"

namespace ferry::scheduler {
namespace {

// The registry: a new rule is one file in queue_rules/, its two functions in rules.h, and a line here.
constexpr std::array kRules = {
    QueueRuleEntry{"aging", "each full --aging-interval-ms waited raises a request's priority by one",
                   AgingEnabled, MakeAging},
    QueueRuleEntry{"late-last",
                   "requests already past their first-token target go after every on-time one, of any priority, "
                   "and preempt none (--serve-late-last, --lane-ttft-ms)",
                   LateLastEnabled, MakeLateLast},
};

}  // namespace

std::span<const QueueRuleEntry> QueueRules() { return kRules; }

QueueOrder::QueueOrder(const SchedulerConfig& config) : name_("priority") {
  for (const QueueRuleEntry& rule : kRules) {
    if (!rule.enabled(config)) continue;
    rules_.push_back(rule.make(config));
    name_ += "+" + std::string(rule.name);
  }
  for (const auto& rule : rules_) can_defer_ = can_defer_ || rule->can_defer();
}

QueueOrder::QueueOrder(std::vector<std::unique_ptr<QueueRule>> rules, std::string name)
    : rules_(std::move(rules)), name_(std::move(name)) {
  for (const auto& rule : rules_) can_defer_ = can_defer_ || rule->can_defer();
}

int64_t QueueOrder::EffectivePriority(const Sequence& seq, TimePoint now) const {
  int64_t priority = seq.spec.priority;
  for (const auto& rule : rules_) priority += rule->Boost(seq, now);
  return priority;
}

void QueueOrder::SetPrefillSecondsPerToken(double seconds) {
  for (const auto& rule : rules_) rule->SetPrefillSecondsPerToken(seconds);
}

bool QueueOrder::Defers(const Sequence& seq, TimePoint now) const {
  if (!can_defer_) return false;
  for (const auto& rule : rules_) {
    if (rule->Defers(seq, now)) return true;
  }
  return false;
}

}  // namespace ferry::scheduler
