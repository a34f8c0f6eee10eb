// KV block accounting: which physical block ids are free and who holds the
// others. Knows nothing of CUDA or of what a block contains.
//
// Ownership: BlockManager owns the pool; a KvLease is one sequence's block
// table and holds one reference on each of its blocks. Destroying or Reset()ting
// a lease drops those references, so freeing cannot be forgotten. The manager
// must outlive every lease it hands out.
//
// Prefix caching (not implemented) slots in here without changing the lease API:
// full blocks get a chained hash and a hash -> block map; KvLease gains a way to
// adopt cached blocks (AddRef); Release of a hashed block to ref 0 parks it on
// an LRU list that AllocateBlock evicts from after the free list is empty.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "scheduler/core/types.h"

namespace ferry::scheduler {

class KvLease;

class BlockManager {
 public:
  BlockManager(int32_t num_blocks, int32_t block_size);
  BlockManager(const BlockManager&) = delete;
  BlockManager& operator=(const BlockManager&) = delete;

  int32_t num_total_blocks() const { return static_cast<int32_t>(ref_counts_.size()); }
  int32_t num_free_blocks() const { return static_cast<int32_t>(free_list_.size()); }
  int32_t block_size() const { return block_size_; }
  int32_t ref_count(BlockId id) const { return ref_counts_.at(static_cast<size_t>(id)); }
  // Blocks needed to hold positions [0, num_tokens).
  int32_t BlocksFor(int32_t num_tokens) const {
    return (num_tokens + block_size_ - 1) / block_size_;
  }

  // An empty block table bound to this pool.
  KvLease NewLease();

 private:
  friend class KvLease;
  // Precondition: num_free_blocks() > 0. The block comes back with ref 1.
  BlockId AllocateBlock();
  void AddRef(BlockId id);
  void Release(BlockId id);

  int32_t block_size_;
  std::vector<int32_t> ref_counts_;  // indexed by block id; 0 == free
  std::deque<BlockId> free_list_;    // FIFO: least recently freed first
};

// One sequence's block table. Move-only; returns its blocks when destroyed.
class KvLease {
 public:
  KvLease() = default;  // unbound: holds nothing, cannot grow
  ~KvLease() { Reset(); }
  KvLease(KvLease&& other) noexcept;
  KvLease& operator=(KvLease&& other) noexcept;
  KvLease(const KvLease&) = delete;
  KvLease& operator=(const KvLease&) = delete;

  std::span<const BlockId> block_ids() const { return block_ids_; }
  int32_t num_blocks() const { return static_cast<int32_t>(block_ids_.size()); }
  // Largest token count the table could cover after taking every free block.
  int32_t MaxCoverableTokens() const;
  // Grows the table so it covers positions [0, num_tokens), appending the new
  // block ids to *new_block_ids. All or nothing: false (and no change) when the
  // pool has too few free blocks. Never shrinks.
  bool Cover(int32_t num_tokens, std::vector<BlockId>* new_block_ids);
  // Returns every block to the pool; the lease stays bound and reusable.
  void Reset();

 private:
  friend class BlockManager;
  explicit KvLease(BlockManager* manager) : manager_(manager) {}

  BlockManager* manager_ = nullptr;
  std::vector<BlockId> block_ids_;
};

}  // namespace ferry::scheduler
