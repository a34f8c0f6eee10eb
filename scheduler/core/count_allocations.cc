#include "scheduler/core/count_allocations.h"

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace {

std::atomic<int64_t> num_allocations{0};
thread_local int64_t num_allocations_here = 0;

void* Allocate(std::size_t size, std::size_t alignment) {
  num_allocations.fetch_add(1, std::memory_order_relaxed);
  ++num_allocations_here;
  if (size == 0) size = 1;
  void* p = alignment <= alignof(std::max_align_t)
                ? std::malloc(size)
                : std::aligned_alloc(alignment, (size + alignment - 1) / alignment * alignment);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace

namespace ferry::testing {

int64_t NumAllocations() { return num_allocations.load(std::memory_order_relaxed); }
int64_t NumAllocationsOnThisThread() { return num_allocations_here; }

}  // namespace ferry::testing

// The array and nothrow forms of the standard library call these.
void* operator new(std::size_t size) { return Allocate(size, alignof(std::max_align_t)); }
void* operator new(std::size_t size, std::align_val_t alignment) {
  return Allocate(size, static_cast<std::size_t>(alignment));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
