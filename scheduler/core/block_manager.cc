#include "scheduler/core/block_manager.h"

#include <stdexcept>
#include <string>
#include <utility>

namespace ferry::scheduler {

BlockManager::BlockManager(int32_t num_blocks, int32_t block_size)
    : block_size_(block_size), ref_counts_(num_blocks < 0 ? 0 : num_blocks, 0) {
  if (num_blocks <= 0) {
    throw std::invalid_argument("num_kv_blocks = " + std::to_string(num_blocks) +
                                ", must be > 0");
  }
  if (block_size <= 0) {
    throw std::invalid_argument("block_size = " + std::to_string(block_size) +
                                ", must be > 0");
  }
  for (BlockId id = 0; id < num_blocks; ++id) free_list_.push_back(id);
}

KvLease BlockManager::NewLease() { return KvLease(this); }

BlockId BlockManager::AllocateBlock() {
  if (free_list_.empty()) throw std::logic_error("AllocateBlock: no free KV block");
  BlockId id = free_list_.front();
  free_list_.pop_front();
  ref_counts_[static_cast<size_t>(id)] = 1;
  return id;
}

void BlockManager::AddRef(BlockId id) {
  int32_t& ref = ref_counts_.at(static_cast<size_t>(id));
  if (ref <= 0) throw std::logic_error("AddRef on free block " + std::to_string(id));
  ++ref;
}

void BlockManager::Release(BlockId id) {
  int32_t& ref = ref_counts_.at(static_cast<size_t>(id));
  if (ref <= 0) throw std::logic_error("Release of free block " + std::to_string(id));
  if (--ref == 0) free_list_.push_back(id);
}

KvLease::KvLease(KvLease&& other) noexcept
    : manager_(std::exchange(other.manager_, nullptr)),
      block_ids_(std::exchange(other.block_ids_, {})) {}

KvLease& KvLease::operator=(KvLease&& other) noexcept {
  if (this != &other) {
    Reset();
    manager_ = std::exchange(other.manager_, nullptr);
    block_ids_ = std::exchange(other.block_ids_, {});
  }
  return *this;
}

int32_t KvLease::MaxCoverableTokens() const {
  if (manager_ == nullptr) return 0;
  return (num_blocks() + manager_->num_free_blocks()) * manager_->block_size();
}

bool KvLease::Cover(int32_t num_tokens, std::vector<BlockId>* new_block_ids) {
  if (manager_ == nullptr) return num_tokens <= 0;
  int32_t needed = manager_->BlocksFor(num_tokens) - num_blocks();
  if (needed <= 0) return true;
  if (needed > manager_->num_free_blocks()) return false;
  for (int32_t i = 0; i < needed; ++i) {
    BlockId id = manager_->AllocateBlock();
    block_ids_.push_back(id);
    if (new_block_ids != nullptr) new_block_ids->push_back(id);
  }
  return true;
}

void KvLease::Reset() {
  if (manager_ == nullptr) return;
  // Release in reverse so the tail blocks (least likely to be a shared prefix
  // once prefix caching exists) are reused first.
  for (auto it = block_ids_.rbegin(); it != block_ids_.rend(); ++it) manager_->Release(*it);
  block_ids_.clear();
}

}  // namespace ferry::scheduler
