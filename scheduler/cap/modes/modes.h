// The modes' factories, for the registry (registry.cc): one per mode file here.
#pragma once

#include <memory>

#include "scheduler/cap/cap_mode.h"

namespace ferry::scheduler {

std::unique_ptr<CapMode> MakeStatic(const ControllerOptions& options);
std::unique_ptr<CapMode> MakeLoadLevel(const ControllerOptions& options);
std::unique_ptr<CapMode> MakeGoodput(const ControllerOptions& options);

}  // namespace ferry::scheduler
