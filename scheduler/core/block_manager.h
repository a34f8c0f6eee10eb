// KV block accounting: which physical block ids are free, which hold a cached
// prefix, and who holds the others. Knows nothing of CUDA or of KV contents.
//
// Ownership: BlockManager owns the pool; a KvLease is one sequence's block
// table and holds one reference on each of its blocks. Destroying or Reset()ting
// a lease drops those references, so freeing cannot be forgotten. The manager
// must outlive every lease it hands out.
//
// Prefix cache: a full, computed block may be published under the chained hash
// of its tokens (HashBlock). Every block is in exactly one of these states:
//   free:     ref 0, not published, on the FIFO free list;
//   held:     ref = number of leases holding it (published or not);
//   cached:   ref 0, published, on the LRU list (evicted, least recently
//             released first, when a block is needed and the free list is empty).
// num_free_blocks() counts free + cached: both can be allocated.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "scheduler/core/ring.h"
#include "scheduler/core/types.h"

namespace ferry::scheduler {

class KvLease;

inline constexpr BlockId kNoBlock = -1;
inline constexpr uint64_t kRootBlockHash = 0x9e3779b97f4a7c15ull;

// Chained hash of one full block: xxh3 of its token ids seeded with the hash of
// the block before it (kRootBlockHash for the first block).
uint64_t HashBlock(uint64_t parent_hash, std::span<const int32_t> tokens);
// Where a sequence's chain starts: kRootBlockHash for the base model, a root of its own for each
// LoRA adapter (xxh3 of the name seeded with kRootBlockHash), so a prefix computed under one
// adapter is never found under another.
uint64_t RootBlockHash(std::string_view lora_name);

// The prefix cache's hash -> block map: open addressing with linear probing, in a table sized
// once (at the first insert) for every block of the pool, so that publishing and evicting
// allocate nothing (#26).
class BlockHashIndex {
 public:
  explicit BlockHashIndex(int32_t num_blocks) : num_blocks_(static_cast<size_t>(num_blocks)) {}
  size_t size() const { return size_; }
  BlockId Find(uint64_t hash) const;  // kNoBlock if absent
  // Preconditions: `hash` is absent, fewer than num_blocks entries.
  void Insert(uint64_t hash, BlockId id);
  void Erase(uint64_t hash);  // absent: nothing happens

 private:
  struct Slot {
    uint64_t hash = 0;
    BlockId id = kNoBlock;  // kNoBlock: empty
  };
  size_t Home(uint64_t hash) const { return static_cast<size_t>(hash) & (slots_.size() - 1); }
  // The slot holding `hash`, or the empty slot ending its probe run.
  size_t Probe(uint64_t hash) const;

  size_t num_blocks_;
  std::vector<Slot> slots_;  // a power of two >= 2 * num_blocks_, or empty before any insert
  size_t size_ = 0;
};

class BlockManager {
 public:
  BlockManager(int32_t num_blocks, int32_t block_size);
  BlockManager(const BlockManager&) = delete;
  BlockManager& operator=(const BlockManager&) = delete;

  int32_t num_total_blocks() const { return static_cast<int32_t>(ref_counts_.size()); }
  // Blocks that can be allocated: free plus cached-unreferenced (evictable).
  int32_t num_free_blocks() const {
    return static_cast<int32_t>(free_list_.size()) + lru_size_;
  }
  int32_t num_evictable_blocks() const { return lru_size_; }
  int32_t num_cached_blocks() const { return static_cast<int32_t>(by_hash_.size()); }
  int32_t block_size() const { return block_size_; }
  int32_t ref_count(BlockId id) const { return ref_counts_.at(static_cast<size_t>(id)); }
  bool is_cached(BlockId id) const { return meta_.at(static_cast<size_t>(id)).is_published; }
  uint64_t cached_hash(BlockId id) const { return meta_.at(static_cast<size_t>(id)).hash; }
  // The token ids a cached block holds (empty if not cached).
  std::span<const int32_t> cached_tokens(BlockId id) const {
    if (!is_cached(id)) return {};
    return std::span<const int32_t>(cached_tokens_).subspan(static_cast<size_t>(id) * block_size_,
                                                            static_cast<size_t>(block_size_));
  }
  // Blocks needed to hold positions [0, num_tokens).
  int32_t BlocksFor(int32_t num_tokens) const {
    return (num_tokens + block_size_ - 1) / block_size_;
  }

  // An empty block table bound to this pool.
  KvLease NewLease();

  // The longest run of cached blocks holding exactly the first blocks of
  // `tokens`, at most `max_blocks`. `hashes[i]` is the chained hash of block i
  // (hashes.size() >= max_blocks). Every hit is verified: its token ids and its
  // parent (the block matched before it, same generation) must be equal.
  std::vector<BlockId> FindCachedPrefix(std::span<const int32_t> tokens,
                                        std::span<const uint64_t> hashes,
                                        int32_t max_blocks) const;
  // Publishes held block `id`, fully computed with `tokens` after block
  // `parent` (kNoBlock for the first). Returns the cached block that now stands
  // for this content: `id`, an equal block cached earlier (`id` stays private),
  // or kNoBlock when another content holds the hash (nothing published).
  BlockId Publish(BlockId id, uint64_t hash, std::span<const int32_t> tokens, BlockId parent);

  // Forgets every cached block (their contents are gone: the worker that held them was lost).
  // Unheld ones return to the free list; held ones stay held, unpublished.
  void DropCache();

  // Throws std::logic_error naming the first inconsistency of the free list,
  // the LRU list or the hash map. O(blocks).
  void CheckConsistency() const;

 private:
  friend class KvLease;
  struct BlockMeta {
    bool is_published = false;
    uint64_t hash = 0;
    uint64_t generation = 0;  // bumped on every allocation: content may change
    BlockId parent = kNoBlock;
    uint64_t parent_generation = 0;
    // Links of the LRU list (cached, ref 0), kNoBlock at its ends: a list threaded through the
    // blocks' own entries, so that a release or a revival allocates nothing.
    BlockId lru_prev = kNoBlock;
    BlockId lru_next = kNoBlock;
  };
  void LruPushBack(BlockId id);
  void LruErase(BlockId id);

  // Precondition: num_free_blocks() > 0. Takes the free list's head, else
  // evicts the least recently used cached block. Comes back with ref 1.
  BlockId AllocateBlock();
  void AddRef(BlockId id);  // from 0 (cached) revives the block off the LRU list
  void Release(BlockId id);
  void Unpublish(BlockId id);
  bool Matches(BlockId id, std::span<const int32_t> tokens, BlockId parent) const;

  int32_t block_size_;
  std::vector<int32_t> ref_counts_;  // indexed by block id
  std::vector<BlockMeta> meta_;      // indexed by block id
  // FIFO, least recently freed first; room for every block, so a free never allocates (issue #53:
  // a deque allocated a block of ids every 128 freed).
  Ring<BlockId> free_list_;
  // Cached, ref 0: least recently released first (BlockMeta::lru_prev, lru_next).
  BlockId lru_head_ = kNoBlock;
  BlockId lru_tail_ = kNoBlock;
  int32_t lru_size_ = 0;
  BlockHashIndex by_hash_;
  // The token ids of each published block, at id * block_size: one allocation at the first
  // publish, none per block.
  std::vector<int32_t> cached_tokens_;
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
  // Room for a table of `num_blocks` without growing it again.
  void Reserve(int32_t num_blocks) { block_ids_.reserve(static_cast<size_t>(num_blocks)); }
  // Takes a reference on each cached block (from FindCachedPrefix) as the
  // start of the table. Precondition: the table is empty.
  void ShareCached(std::span<const BlockId> blocks);
  // Returns the blocks past those covering [0, num_tokens) to the pool (speculative decoding's
  // rollback of draft slots).
  void Truncate(int32_t num_tokens);
  // Returns every block to the pool; the lease stays bound and reusable.
  void Reset();

 private:
  friend class BlockManager;
  explicit KvLease(BlockManager* manager) : manager_(manager) {}

  BlockManager* manager_ = nullptr;
  std::vector<BlockId> block_ids_;
};

}  // namespace ferry::scheduler
