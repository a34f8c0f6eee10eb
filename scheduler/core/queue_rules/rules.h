// The queue rules' factories, for the registry in queue_order.cc (one pair per rule file here).
#pragma once

#include <memory>

#include "scheduler/core/queue_order.h"

namespace ferry::scheduler {

bool AgingEnabled(const SchedulerConfig& config);
std::unique_ptr<QueueRule> MakeAging(const SchedulerConfig& config);

bool LateLastEnabled(const SchedulerConfig& config);
std::unique_ptr<QueueRule> MakeLateLast(const SchedulerConfig& config);

}  // namespace ferry::scheduler
