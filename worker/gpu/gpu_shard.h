// Tensor-parallel sharding for the GPU engine: the CPU path's ShardPlan (worker/model), the same
// rules restated here so the GPU engine links without the CPU engine's oneDNN/OpenBLAS objects
// (tests/gpu builds it on machines that have neither). cuda_runner_test checks that both agree.
#pragma once

#include <cstdint>

#include "worker/model/qwen2_config.h"
#include "worker/model/qwen2_model.h"

namespace ferry::worker::gpu {

// Throws std::runtime_error when the model cannot be split that way (as PlanShard).
ShardPlan PlanGpuShard(const Qwen2Config& config, int32_t rank, int32_t size);

}  // namespace ferry::worker::gpu
