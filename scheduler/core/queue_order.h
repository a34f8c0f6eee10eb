// The waiting queue's order, as rules (issue #54; README.md "Queue order").
//
// The base order is strict priority, then arrival: the queue keeps one deque per base priority, each in
// arrival order with a preempted sequence in front, and offers its sequences by merging the deques' heads,
// the highest rank first (ties to the earlier arrival, then the higher base priority). With every request
// at one priority that is first come, first served. A rule changes the order in one of two ways:
// - Boost: raises a sequence's rank at `now` above its spec.priority. The merge compares it, and running
//   sequences are served and preempted by it too (Sequence::effective_priority).
// - Defers: offers a sequence in a second pass, after every sequence not deferred (of any priority), in the
//   same order among the deferred; a deferred sequence preempts nothing.
// Rules are registered by name in queue_order.cc (QueueRules), each turned on by the scheduler's config.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "scheduler/core/types.h"

namespace ferry::scheduler {

struct Sequence;

class QueueRule {
 public:
  virtual ~QueueRule() = default;
  // Added to spec.priority at `now` (>= 0).
  virtual int64_t Boost(const Sequence&, TimePoint) const { return 0; }
  // Offered after every sequence not deferred at `now`, whatever their priorities; preempts none.
  virtual bool Defers(const Sequence&, TimePoint) const { return false; }
  // Whether Defers can ever hold: the queue then makes its second pass.
  virtual bool can_defer() const { return false; }
  // What a computed prompt token costs now (seconds; 0: not known), measured by the caller's step fit.
  virtual void SetPrefillSecondsPerToken(double) {}
};

// A rule's registration: its name (as the docs and the scheduler's state name it), what it does, whether a
// configuration turns it on, and how to make it from that configuration.
struct QueueRuleEntry {
  std::string_view name;
  std::string_view summary;
  bool (*enabled)(const SchedulerConfig&);
  std::unique_ptr<QueueRule> (*make)(const SchedulerConfig&);
};

// Every registered rule, in the order they apply.
std::span<const QueueRuleEntry> QueueRules();

// The rules a configuration turns on, applied together.
class QueueOrder {
 public:
  explicit QueueOrder(const SchedulerConfig& config);
  // Given rules (tests; a rule not yet registered).
  explicit QueueOrder(std::vector<std::unique_ptr<QueueRule>> rules, std::string name = "custom");

  // spec.priority plus every rule's boost at `now`.
  int64_t EffectivePriority(const Sequence& seq, TimePoint now) const;
  // Some rule defers it at `now`.
  bool Defers(const Sequence& seq, TimePoint now) const;
  bool can_defer() const { return can_defer_; }
  // To every rule (QueueRule::SetPrefillSecondsPerToken).
  void SetPrefillSecondsPerToken(double seconds);
  // "priority" and the rules on, joined by '+': "priority+aging+late-last".
  const std::string& name() const { return name_; }

 private:
  std::vector<std::unique_ptr<QueueRule>> rules_;
  bool can_defer_ = false;
  std::string name_;
};

}  // namespace ferry::scheduler
