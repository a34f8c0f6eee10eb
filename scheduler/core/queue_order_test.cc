// The waiting queue's order as rules (queue_order.h): the registry, the rules a configuration turns on, and a
// rule that is not registered (the README's example) plugged into the queue's merge.
#include "scheduler/core/queue_order.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "scheduler/core/block_manager.h"
#include "scheduler/core/sequence.h"

namespace ferry::scheduler {
namespace {

TimePoint At(int ms) { return TimePoint(std::chrono::milliseconds(ms)); }

// Waiting sequences made from specs, queued by arrival.
class Queue {
 public:
  void Add(uint64_t id, int32_t priority, int arrival_ms, int32_t prompt_len, int first_token_target_ms = -1) {
    RequestSpec spec;
    spec.seq_id = id;
    spec.priority = priority;
    spec.arrival = At(arrival_ms);
    spec.prompt.assign(static_cast<size_t>(prompt_len), 7);
    spec.max_tokens = 1;
    if (first_token_target_ms >= 0) spec.first_token_target = At(first_token_target_ms);
    seqs_.push_back(std::make_unique<Sequence>(std::move(spec), blocks_.NewLease()));
    waiting_.PushByArrival(seqs_.back().get());
  }
  std::vector<uint64_t> Order(const QueueOrder& order, int now_ms) const {
    std::vector<uint64_t> ids;
    waiting_.VisitInOrder(At(now_ms), order, [&](Sequence& s) {
      ids.push_back(s.spec.seq_id);
      return true;
    });
    return ids;
  }

 private:
  BlockManager blocks_{16, 4};
  std::vector<std::unique_ptr<Sequence>> seqs_;  // before waiting_: outlives its pointers
  WaitingQueue waiting_;
};

TEST(QueueOrderTest, TheRegistryNamesEachRuleAndTheConfigTurnsThemOn) {
  std::vector<std::string> names;
  for (const QueueRuleEntry& rule : QueueRules()) {
    names.emplace_back(rule.name);
    EXPECT_FALSE(rule.summary.empty()) << rule.name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"aging", "late-last"}));
  SchedulerConfig config;
  EXPECT_EQ(QueueOrder(config).name(), "priority");
  config.serve_late_last = true;
  EXPECT_EQ(QueueOrder(config).name(), "priority+late-last");
  EXPECT_TRUE(QueueOrder(config).can_defer());
  config.aging_interval_ms = 100;
  EXPECT_EQ(QueueOrder(config).name(), "priority+aging+late-last");
  config.serve_late_last = false;
  EXPECT_EQ(QueueOrder(config).name(), "priority+aging");
  EXPECT_FALSE(QueueOrder(config).can_defer());
}

TEST(QueueOrderTest, PriorityThenArrivalAgingAndLateLast) {
  Queue q;
  q.Add(1, /*priority=*/0, /*arrival_ms=*/0, 4, /*first_token_target_ms=*/50);
  q.Add(2, 5, 10, 4);
  q.Add(3, 0, 20, 4, /*first_token_target_ms=*/500);
  SchedulerConfig config;
  EXPECT_EQ(q.Order(QueueOrder(config), 100), (std::vector<uint64_t>{2, 1, 3}));
  // At one step per ms waited, 1 ranks 100 at 100 ms and beats 2's 5 + 90; 3 ranks 80.
  config.aging_interval_ms = 1;
  EXPECT_EQ(q.Order(QueueOrder(config), 100), (std::vector<uint64_t>{1, 2, 3}));
  // 1 is past its target at 100 ms: it goes after 3, the rest of its priority.
  config.aging_interval_ms = 0;
  config.serve_late_last = true;
  EXPECT_EQ(q.Order(QueueOrder(config), 100), (std::vector<uint64_t>{2, 3, 1}));
  EXPECT_EQ(q.Order(QueueOrder(config), 40), (std::vector<uint64_t>{2, 1, 3}));  // not late yet
}

TEST(QueueOrderTest, ALateRequestGoesAfterTheOnTimeOnesOfEveryPriority) {
  Queue q;
  q.Add(1, /*priority=*/5, /*arrival_ms=*/0, 4, /*first_token_target_ms=*/50);
  q.Add(2, 0, 10, 4, /*first_token_target_ms=*/500);
  q.Add(3, 5, 20, 4, /*first_token_target_ms=*/70);
  q.Add(4, 0, 30, 4, /*first_token_target_ms=*/60);
  SchedulerConfig config;
  config.serve_late_last = true;
  EXPECT_EQ(q.Order(QueueOrder(config), 40), (std::vector<uint64_t>{1, 3, 2, 4}));  // all on time: priority
  // At 65 ms, 1 and 4 are late: the on-time ones by priority, then the late ones by priority.
  EXPECT_EQ(q.Order(QueueOrder(config), 65), (std::vector<uint64_t>{3, 2, 1, 4}));
  // At 100 ms only 2 is on time: it goes before the priority-5 requests.
  EXPECT_EQ(q.Order(QueueOrder(config), 100), (std::vector<uint64_t>{2, 1, 3, 4}));
}

TEST(QueueOrderTest, LateLastCountsARequestLateOnceItsPrefillNoLongerFits) {
  Queue q;
  q.Add(1, 0, 0, /*prompt_len=*/400, /*first_token_target_ms=*/1000);
  q.Add(2, 0, 10, 40, 1010);
  q.Add(3, 0, 20, 400);  // no target: never late
  SchedulerConfig config;
  config.serve_late_last = true;
  QueueOrder order(config);
  // At 800 ms, 1 has 200 ms left: within its target, and so on time while no prefill cost is known.
  EXPECT_EQ(q.Order(order, 800), (std::vector<uint64_t>{1, 2, 3}));
  // At 1 ms a prompt token its 400 tokens take 400 ms: it cannot be on time any more, while 2's 40 tokens
  // (40 ms) fit in its 210 ms. 3 has no target.
  order.SetPrefillSecondsPerToken(0.001);
  EXPECT_EQ(q.Order(order, 800), (std::vector<uint64_t>{2, 3, 1}));
  EXPECT_EQ(q.Order(order, 500), (std::vector<uint64_t>{1, 2, 3}));  // 500 ms left: it fits
  order.SetPrefillSecondsPerToken(0);
  EXPECT_EQ(q.Order(order, 800), (std::vector<uint64_t>{1, 2, 3}));
}

// The README's example of a new rule: long prompts after short ones.
class LongPromptsLast final : public QueueRule {
 public:
  bool Defers(const Sequence& seq, TimePoint) const override { return seq.num_prompt_tokens() > 8; }
  bool can_defer() const override { return true; }
};

TEST(QueueOrderTest, ARuleNotYetRegisteredPlugsIntoTheMerge) {
  Queue q;
  q.Add(1, 0, 0, /*prompt_len=*/32);
  q.Add(2, 0, 1, 4);
  q.Add(3, 1, 2, 64);
  q.Add(4, 0, 3, 6);
  std::vector<std::unique_ptr<QueueRule>> rules;
  rules.push_back(std::make_unique<LongPromptsLast>());
  const QueueOrder order(std::move(rules), "priority+long-prompts-last");
  // The short ones first (by priority, then arrival), then the deferred long ones in the same order.
  EXPECT_EQ(q.Order(order, 10), (std::vector<uint64_t>{2, 4, 3, 1}));
  EXPECT_EQ(q.Order(QueueOrder(SchedulerConfig{}), 10), (std::vector<uint64_t>{3, 1, 2, 4}));
}

}  // namespace
}  // namespace ferry::scheduler
