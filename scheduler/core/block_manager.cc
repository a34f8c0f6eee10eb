#include "scheduler/core/block_manager.h"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <stdexcept>
#include <string>
#include <utility>

namespace ferry::scheduler {
namespace {

std::string Num(int64_t v) { return std::to_string(v); }

}  // namespace

uint64_t HashBlock(uint64_t parent_hash, std::span<const int32_t> tokens) {
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), parent_hash);
}

uint64_t RootBlockHash(std::string_view lora_name) {
  if (lora_name.empty()) return kRootBlockHash;
  return XXH3_64bits_withSeed(lora_name.data(), lora_name.size(), kRootBlockHash);
}

size_t BlockHashIndex::Probe(uint64_t hash) const {
  size_t i = Home(hash);
  while (slots_[i].id != kNoBlock && slots_[i].hash != hash) i = (i + 1) & (slots_.size() - 1);
  return i;
}

BlockId BlockHashIndex::Find(uint64_t hash) const {
  return slots_.empty() ? kNoBlock : slots_[Probe(hash)].id;
}

void BlockHashIndex::Insert(uint64_t hash, BlockId id) {
  if (slots_.empty()) slots_.resize(std::bit_ceil(2 * std::max<size_t>(num_blocks_, 1)));
  if (size_ >= num_blocks_) throw std::logic_error("BlockHashIndex: more entries than blocks");
  Slot& slot = slots_[Probe(hash)];
  if (slot.id != kNoBlock) throw std::logic_error("BlockHashIndex: hash inserted twice");
  slot = Slot{hash, id};
  ++size_;
}

void BlockHashIndex::Erase(uint64_t hash) {
  if (slots_.empty()) return;
  const size_t mask = slots_.size() - 1;
  size_t hole = Probe(hash);
  if (slots_[hole].id == kNoBlock) return;
  slots_[hole].id = kNoBlock;
  --size_;
  // Backward shift: an entry after the hole moves into it unless its home lies cyclically in
  // (hole, j], so that every entry stays reachable from its home without tombstones.
  for (size_t j = (hole + 1) & mask; slots_[j].id != kNoBlock; j = (j + 1) & mask) {
    const size_t home = Home(slots_[j].hash);
    const bool stays = hole < j ? (home > hole && home <= j) : (home > hole || home <= j);
    if (stays) continue;
    slots_[hole] = slots_[j];
    slots_[j].id = kNoBlock;
    hole = j;
  }
}

BlockManager::BlockManager(int32_t num_blocks, int32_t block_size)
    : block_size_(block_size),
      ref_counts_(num_blocks < 0 ? 0 : num_blocks, 0),
      meta_(num_blocks < 0 ? 0 : num_blocks),
      by_hash_(num_blocks < 0 ? 0 : num_blocks) {
  if (num_blocks <= 0) {
    throw std::invalid_argument("num_kv_blocks = " + Num(num_blocks) + ", must be > 0");
  }
  if (block_size <= 0) {
    throw std::invalid_argument("block_size = " + Num(block_size) + ", must be > 0");
  }
  free_list_.Reserve(static_cast<size_t>(num_blocks));
  for (BlockId id = 0; id < num_blocks; ++id) free_list_.push_back(id);
}

void BlockManager::LruPushBack(BlockId id) {
  BlockMeta& meta = meta_[static_cast<size_t>(id)];
  meta.lru_prev = lru_tail_;
  meta.lru_next = kNoBlock;
  if (lru_tail_ != kNoBlock) {
    meta_[static_cast<size_t>(lru_tail_)].lru_next = id;
  } else {
    lru_head_ = id;
  }
  lru_tail_ = id;
  ++lru_size_;
}

void BlockManager::LruErase(BlockId id) {
  BlockMeta& meta = meta_[static_cast<size_t>(id)];
  (meta.lru_prev != kNoBlock ? meta_[static_cast<size_t>(meta.lru_prev)].lru_next : lru_head_) = meta.lru_next;
  (meta.lru_next != kNoBlock ? meta_[static_cast<size_t>(meta.lru_next)].lru_prev : lru_tail_) = meta.lru_prev;
  meta.lru_prev = meta.lru_next = kNoBlock;
  --lru_size_;
}

KvLease BlockManager::NewLease() { return KvLease(this); }

BlockId BlockManager::AllocateBlock() {
  BlockId id;
  if (!free_list_.empty()) {
    id = free_list_.front();
    free_list_.pop_front();
  } else if (lru_head_ != kNoBlock) {
    id = lru_head_;  // evict the least recently used cached block
    Unpublish(id);      // moves it to the free list's tail
    free_list_.pop_back();
  } else {
    throw std::logic_error("AllocateBlock: no free KV block");
  }
  BlockMeta& meta = meta_[static_cast<size_t>(id)];
  ++meta.generation;
  ref_counts_[static_cast<size_t>(id)] = 1;
  return id;
}

void BlockManager::AddRef(BlockId id) {
  int32_t& ref = ref_counts_.at(static_cast<size_t>(id));
  BlockMeta& meta = meta_[static_cast<size_t>(id)];
  if (ref == 0) {
    if (!meta.is_published) throw std::logic_error("AddRef on free block " + Num(id));
    LruErase(id);
  }
  ++ref;
}

void BlockManager::Release(BlockId id) {
  int32_t& ref = ref_counts_.at(static_cast<size_t>(id));
  if (ref <= 0) throw std::logic_error("Release of free block " + Num(id));
  if (--ref > 0) return;
  BlockMeta& meta = meta_[static_cast<size_t>(id)];
  if (meta.is_published) {
    LruPushBack(id);
  } else {
    free_list_.push_back(id);
  }
}

void BlockManager::Unpublish(BlockId id) {
  BlockMeta& meta = meta_[static_cast<size_t>(id)];
  if (!meta.is_published) return;
  by_hash_.Erase(meta.hash);
  meta.is_published = false;
  meta.parent = kNoBlock;
  ++meta.generation;  // children published on top of it can no longer match
  if (ref_counts_[static_cast<size_t>(id)] == 0) {
    LruErase(id);
    free_list_.push_back(id);
  }
}

void BlockManager::DropCache() {
  for (BlockId id = 0; id < num_total_blocks(); ++id) Unpublish(id);
}

bool BlockManager::Matches(BlockId id, std::span<const int32_t> tokens, BlockId parent) const {
  const BlockMeta& meta = meta_[static_cast<size_t>(id)];
  if (!meta.is_published || meta.parent != parent) return false;
  if (parent != kNoBlock &&
      meta.parent_generation != meta_[static_cast<size_t>(parent)].generation) {
    return false;
  }
  const auto cached = cached_tokens(id);
  return std::equal(cached.begin(), cached.end(), tokens.begin(), tokens.end());
}

std::vector<BlockId> BlockManager::FindCachedPrefix(std::span<const int32_t> tokens,
                                                    std::span<const uint64_t> hashes,
                                                    int32_t max_blocks) const {
  std::vector<BlockId> found;
  BlockId parent = kNoBlock;
  for (int32_t i = 0; i < max_blocks; ++i) {
    const BlockId hit = by_hash_.Find(hashes[static_cast<size_t>(i)]);
    if (hit == kNoBlock) break;
    auto block_tokens = tokens.subspan(static_cast<size_t>(i) * block_size_,
                                       static_cast<size_t>(block_size_));
    if (!Matches(hit, block_tokens, parent)) break;  // a hash collision
    parent = hit;
    found.push_back(parent);
  }
  return found;
}

BlockId BlockManager::Publish(BlockId id, uint64_t hash, std::span<const int32_t> tokens,
                              BlockId parent) {
  BlockMeta& meta = meta_.at(static_cast<size_t>(id));
  if (ref_counts_[static_cast<size_t>(id)] <= 0) {
    throw std::logic_error("Publish of unheld block " + Num(id));
  }
  if (meta.is_published) return id;  // shared from the cache: already canonical
  if (tokens.size() != static_cast<size_t>(block_size_)) {
    throw std::logic_error("Publish of block " + Num(id) + " with " + Num(static_cast<int64_t>(tokens.size())) +
                           " tokens, not a full block");
  }
  if (const BlockId other = by_hash_.Find(hash); other != kNoBlock) {
    if (Matches(other, tokens, parent)) return other;
    // A different content under this hash. An unreferenced one (stale: its
    // parent was evicted) gives way; a held one wins and `id` stays private.
    if (ref_counts_[static_cast<size_t>(other)] > 0) return kNoBlock;
    Unpublish(other);
  }
  if (cached_tokens_.empty()) cached_tokens_.resize(meta_.size() * static_cast<size_t>(block_size_));
  meta.is_published = true;
  meta.hash = hash;
  std::copy(tokens.begin(), tokens.end(), cached_tokens_.begin() + static_cast<ptrdiff_t>(id) * block_size_);
  meta.parent = parent;
  meta.parent_generation = parent == kNoBlock ? 0 : meta_[static_cast<size_t>(parent)].generation;
  by_hash_.Insert(hash, id);
  return id;
}

void BlockManager::CheckConsistency() const {
  auto fail = [](const std::string& what) { throw std::logic_error("block manager: " + what); };
  std::vector<int> listed(ref_counts_.size(), 0);
  for (BlockId b : free_list_) {
    if (listed.at(static_cast<size_t>(b))++) fail("block " + Num(b) + " listed twice");
    if (ref_count(b) != 0 || is_cached(b)) fail("free block " + Num(b) + " is held or cached");
  }
  int32_t lru_count = 0;
  BlockId prev = kNoBlock;
  for (BlockId b = lru_head_; b != kNoBlock; prev = b, b = meta_[static_cast<size_t>(b)].lru_next) {
    if (listed.at(static_cast<size_t>(b))++) fail("block " + Num(b) + " listed twice");
    if (ref_count(b) != 0 || !is_cached(b)) fail("LRU block " + Num(b) + " is held or uncached");
    if (meta_[static_cast<size_t>(b)].lru_prev != prev) fail("LRU block " + Num(b) + " links back wrong");
    ++lru_count;
  }
  if (prev != lru_tail_ || lru_count != lru_size_) fail("LRU list's tail or size is off");
  size_t num_published = 0;
  for (BlockId b = 0; b < num_total_blocks(); ++b) {
    const BlockMeta& meta = meta_[static_cast<size_t>(b)];
    if (ref_count(b) < 0) fail("block " + Num(b) + " has a negative ref count");
    if (ref_count(b) == 0 && !listed[static_cast<size_t>(b)]) fail("unheld block " + Num(b) + " unlisted");
    if (!meta.is_published) continue;
    ++num_published;
    if (by_hash_.Find(meta.hash) != b) fail("cached block " + Num(b) + " not in map");
  }
  if (num_published != by_hash_.size()) fail("hash map and cached blocks differ");
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

void KvLease::ShareCached(std::span<const BlockId> blocks) {
  if (manager_ == nullptr || !block_ids_.empty()) {
    throw std::logic_error("ShareCached: lease unbound or not empty");
  }
  for (BlockId id : blocks) {
    if (!manager_->is_cached(id)) throw std::logic_error("ShareCached: block not cached");
    manager_->AddRef(id);
    block_ids_.push_back(id);
  }
}

void KvLease::Truncate(int32_t num_tokens) {
  if (manager_ == nullptr) return;
  const auto keep = static_cast<size_t>(manager_->BlocksFor(num_tokens));
  while (block_ids_.size() > keep) {
    manager_->Release(block_ids_.back());
    block_ids_.pop_back();
  }
}

void KvLease::Reset() {
  if (manager_ == nullptr) return;
  // Release in reverse so a sequence's tail blocks (the least likely to be a
  // shared prefix) are the first evicted from the LRU list.
  for (auto it = block_ids_.rbegin(); it != block_ids_.rend(); ++it) manager_->Release(*it);
  block_ids_.clear();
}

}  // namespace ferry::scheduler
