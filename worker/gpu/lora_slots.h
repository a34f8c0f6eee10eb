// The GPU engine's LoRA adapters in device memory (issue #57): --max-loras slots, each holding one
// adapter's bf16 A and B for every layer and projection, and per layer and projection a device
// table of kernels/cuda LoraSlotWeights that the kernels read through each token row's slot
// (BatchLayout::lora_slot). LoraSlotTable (pure host logic) decides which adapter sits in which
// slot for a step: one resident keeps its slot, a new one takes the least recently used slot no
// adapter of the step holds. The weights come from the same LoraRegistry as the CPU engine's
// (worker/lora), read with bf16_weights, so both engines serve the same adapters the same way.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/cuda/lora.h"
#include "worker/arch/model_config.h"
#include "worker/arch/shard_plan.h"
#include "worker/gpu/device_buffer.h"
#include "worker/lora/lora_adapter.h"

namespace ferry::worker::gpu {

class LoraSlotTable {
 public:
  explicit LoraSlotTable(int32_t num_slots);

  // The slot of each of `adapters` (distinct, non-null) for a step, in order. Adapters placed in a
  // slot by this call go into `placed` (slot, adapter): the caller uploads them before the step
  // runs. Slots hold their adapter (a shared_ptr: the address is never another adapter's) until
  // evicted. Throws std::invalid_argument, changing nothing, for more adapters than slots.
  std::vector<int32_t> Assign(const std::vector<std::shared_ptr<const LoraAdapter>>& adapters,
                              std::vector<std::pair<int32_t, std::shared_ptr<const LoraAdapter>>>& placed);
  int32_t num_slots() const { return static_cast<int32_t>(resident_.size()); }
  const LoraAdapter* resident(int32_t slot) const { return resident_[slot].get(); }

 private:
  std::vector<std::shared_ptr<const LoraAdapter>> resident_;  // by slot; null: empty
  std::vector<uint64_t> last_used_;                           // by slot: the Assign that last used it
  uint64_t clock_ = 0;
};

// The device side: weights and slot tables.
class DeviceLoraSlots {
 public:
  // Sizes every slot for `max_rank` and the shard's projection shapes (LoraShardShape).
  DeviceLoraSlots(const ModelConfig& config, const ShardPlan& shard, int32_t num_slots, int32_t max_rank);

  // Copies `adapter` (read for this shard, bf16 weights) into `slot` and updates the slot tables,
  // on `stream` (the host copies are staged before it returns). Throws std::invalid_argument when
  // its shapes or rank do not fit, CudaError on a copy failure.
  void Upload(int32_t slot, const LoraAdapter& adapter, cudaStream_t stream);
  // Device [num_slots] for one layer and projection.
  const kernels::cuda::LoraSlotWeights* table(int32_t layer, LoraTarget target) const;
  int32_t num_slots() const { return num_slots_; }
  int32_t max_rank() const { return max_rank_; }
  int64_t bytes() const { return static_cast<int64_t>(weights_.bytes() + tables_.bytes()); }

 private:
  size_t Offset(int32_t slot, int32_t layer, int32_t target) const;  // in bf16 elements

  const int32_t num_layers_, num_slots_, max_rank_;
  std::vector<std::pair<int64_t, int64_t>> shapes_;  // by target: {in, out} on this shard
  size_t slot_elems_ = 0;                            // bf16 elements of one slot
  DeviceBuffer weights_;                             // [num_slots, slot_elems_]
  DeviceBuffer tables_;                              // [layers, targets, num_slots] LoraSlotWeights
  std::vector<kernels::cuda::LoraSlotWeights> host_tables_;
};

// A projection's {in, out} on one shard of the model (column-parallel q/k/v/gate/up keep their
// heads' or columns' outputs, row-parallel o/down their inputs), as LoadLoraAdapter shards it.
std::pair<int64_t, int64_t> LoraShardShape(LoraTarget target, const ModelConfig& config, const ShardPlan& shard);

}  // namespace ferry::worker::gpu
