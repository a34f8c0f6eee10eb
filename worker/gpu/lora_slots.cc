#include "worker/gpu/lora_slots.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.h"

namespace ferry::worker::gpu {

namespace kcu = kernels::cuda;

LoraSlotTable::LoraSlotTable(int32_t num_slots) : resident_(num_slots), last_used_(num_slots, 0) {
  if (num_slots < 1) throw std::invalid_argument("LoRA slots: " + std::to_string(num_slots) + ", want >= 1");
}

std::vector<int32_t> LoraSlotTable::Assign(const std::vector<std::shared_ptr<const LoraAdapter>>& adapters,
                                           std::vector<std::pair<int32_t, std::shared_ptr<const LoraAdapter>>>& placed) {
  placed.clear();
  if (static_cast<int32_t>(adapters.size()) > num_slots()) {
    throw std::invalid_argument("the step runs " + std::to_string(adapters.size()) +
                                " distinct LoRA adapters, above --max-loras " + std::to_string(num_slots()));
  }
  ++clock_;
  std::vector<int32_t> slots(adapters.size(), -1);
  std::vector<bool> taken(resident_.size(), false);
  for (size_t i = 0; i < adapters.size(); ++i) {  // the resident keep their slots
    for (int32_t s = 0; s < num_slots(); ++s) {
      if (resident_[s] == adapters[i]) {
        slots[i] = s;
        taken[s] = true;
      }
    }
  }
  for (size_t i = 0; i < adapters.size(); ++i) {
    if (slots[i] >= 0) continue;
    int32_t best = -1;  // an empty slot first, else the least recently used one the step does not need
    for (int32_t s = 0; s < num_slots(); ++s) {
      if (taken[s]) continue;
      if (best < 0 || (resident_[s] == nullptr) > (resident_[best] == nullptr) ||
          ((resident_[s] == nullptr) == (resident_[best] == nullptr) && last_used_[s] < last_used_[best])) {
        best = s;
      }
    }
    slots[i] = best;  // exists: no more adapters than slots
    taken[best] = true;
    resident_[best] = adapters[i];
    placed.emplace_back(best, adapters[i]);
  }
  for (const int32_t s : slots) last_used_[s] = clock_;
  return slots;
}

std::pair<int64_t, int64_t> LoraShardShape(LoraTarget target, const ModelConfig& c, const ShardPlan& s) {
  const int64_t hidden = c.hidden_size, d = c.head_dim;
  const int64_t nq = int64_t{s.num_q_heads} * d, nk = int64_t{s.num_kv_heads} * d, inter = s.inter_size;
  switch (target) {
    case LoraTarget::kQ: return {hidden, nq};
    case LoraTarget::kK:
    case LoraTarget::kV: return {hidden, nk};
    case LoraTarget::kO: return {nq, hidden};
    case LoraTarget::kGate:
    case LoraTarget::kUp: return {hidden, inter};
    case LoraTarget::kDown: return {inter, hidden};
  }
  throw std::logic_error("LoraShardShape: unknown target");
}

DeviceLoraSlots::DeviceLoraSlots(const ModelConfig& config, const ShardPlan& shard, int32_t num_slots,
                                 int32_t max_rank)
    : num_layers_(config.num_hidden_layers), num_slots_(num_slots), max_rank_(max_rank) {
  if (max_rank < 1 || max_rank > kcu::kMaxLoraRank) {
    throw std::invalid_argument("--max-lora-rank = " + std::to_string(max_rank) + ", want 1.." +
                                std::to_string(kcu::kMaxLoraRank) + " on the GPU engine");
  }
  for (int32_t t = 0; t < kNumLoraTargets; ++t) {
    shapes_.push_back(LoraShardShape(static_cast<LoraTarget>(t), config, shard));
    slot_elems_ += size_t(num_layers_) * max_rank * (shapes_.back().first + shapes_.back().second);
  }
  weights_ = DeviceBuffer(size_t(num_slots) * slot_elems_ * sizeof(uint16_t));
  host_tables_.assign(size_t(num_layers_) * kNumLoraTargets * num_slots, kcu::LoraSlotWeights{});
  tables_ = DeviceBuffer(host_tables_.size() * sizeof(kcu::LoraSlotWeights));
  FERRY_CUDA_CHECK(cudaMemcpy(tables_.get(), host_tables_.data(), tables_.bytes(), cudaMemcpyHostToDevice));
}

size_t DeviceLoraSlots::Offset(int32_t slot, int32_t layer, int32_t target) const {
  size_t at = size_t(slot) * slot_elems_;
  for (int32_t t = 0; t < kNumLoraTargets; ++t) {  // slot-major, then target, then layer
    const size_t per_layer = size_t(max_rank_) * (shapes_[t].first + shapes_[t].second);
    if (t == target) return at + size_t(layer) * per_layer;
    at += size_t(num_layers_) * per_layer;
  }
  throw std::logic_error("DeviceLoraSlots::Offset: unknown target");
}

void DeviceLoraSlots::Upload(int32_t slot, const LoraAdapter& adapter, cudaStream_t stream) {
  if (slot < 0 || slot >= num_slots_) throw std::invalid_argument("LoRA slot " + std::to_string(slot) + " out of range");
  if (adapter.config.rank > max_rank_) {
    throw std::invalid_argument("LoRA adapter \"" + adapter.name + "\": r = " + std::to_string(adapter.config.rank) +
                                " is above --max-lora-rank " + std::to_string(max_rank_));
  }
  if (static_cast<int32_t>(adapter.layers.size()) != num_layers_) {
    throw std::invalid_argument("LoRA adapter \"" + adapter.name + "\": " + std::to_string(adapter.layers.size()) +
                                " layers, the model has " + std::to_string(num_layers_));
  }
  auto* base = weights_.as<uint16_t>();
  for (int32_t layer = 0; layer < num_layers_; ++layer) {
    for (int32_t t = 0; t < kNumLoraTargets; ++t) {
      kcu::LoraSlotWeights& entry = host_tables_[(size_t(layer) * kNumLoraTargets + t) * num_slots_ + slot];
      entry = {};
      const std::optional<LoraModule>& m = adapter.layers[layer][t];
      if (!m) continue;  // not targeted: the kernels leave the base output
      const auto [in, out] = shapes_[t];
      if (m->in != in || m->out != out || m->a_bf16.empty()) {
        throw std::invalid_argument("LoRA adapter \"" + adapter.name + "\": layer " + std::to_string(layer) + " " +
                                    LoraTargetName(static_cast<LoraTarget>(t)) + " is not [" + std::to_string(in) +
                                    " -> " + std::to_string(out) + "] in bf16 on this shard");
      }
      uint16_t* a = base + Offset(slot, layer, t);
      uint16_t* b_t = a + size_t(max_rank_) * in;
      const int32_t rank = adapter.config.rank;
      FERRY_CUDA_CHECK(cudaMemcpyAsync(a, m->a_bf16.data(), size_t(rank) * in * sizeof(uint16_t),
                                       cudaMemcpyHostToDevice, stream));
      FERRY_CUDA_CHECK(cudaMemcpyAsync(b_t, m->b_t_bf16.data(), size_t(rank) * out * sizeof(uint16_t),
                                       cudaMemcpyHostToDevice, stream));
      entry = {a, b_t, rank, adapter.scale};
    }
  }
  // Pageable host memory: each copy is staged before cudaMemcpyAsync returns, so the host tables
  // may change for the next step while this one waits on the stream.
  FERRY_CUDA_CHECK(cudaMemcpyAsync(tables_.get(), host_tables_.data(), tables_.bytes(), cudaMemcpyHostToDevice, stream));
}

const kcu::LoraSlotWeights* DeviceLoraSlots::table(int32_t layer, LoraTarget target) const {
  return tables_.as<kcu::LoraSlotWeights>() + (size_t(layer) * kNumLoraTargets + static_cast<int32_t>(target)) * num_slots_;
}

}  // namespace ferry::worker::gpu
