// A FIFO over one array that grows and never shrinks: push_back and pop_front reuse its slots, so a
// window that slides at a steady size (the controller's recent arrivals, completions and changes)
// allocates nothing once it reached that size. std::deque allocates a block every few hundred bytes
// pushed and frees one as many popped: an allocation every few dozen steps for ever (issue #53).
// A popped slot keeps its object, so a slot reused by PushSlot keeps its strings' capacity too.
#pragma once

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <utility>
#include <vector>

namespace ferry::scheduler {

template <class T>
class Ring {
 public:
  class const_iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = T;
    using difference_type = std::ptrdiff_t;
    using pointer = const T*;
    using reference = const T&;
    const_iterator(const Ring* ring, size_t i) : ring_(ring), i_(i) {}
    const T& operator*() const { return (*ring_)[i_]; }
    const T* operator->() const { return &(*ring_)[i_]; }
    const_iterator& operator++() {
      ++i_;
      return *this;
    }
    bool operator==(const const_iterator& o) const { return i_ == o.i_; }
    bool operator!=(const const_iterator& o) const { return i_ != o.i_; }

   private:
    const Ring* ring_;
    size_t i_;
  };

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // The i-th element from the front.
  const T& operator[](size_t i) const { return slots_[(head_ + i) % slots_.size()]; }
  T& operator[](size_t i) { return slots_[(head_ + i) % slots_.size()]; }
  const T& front() const { return (*this)[0]; }
  const T& back() const { return (*this)[size_ - 1]; }
  const_iterator begin() const { return {this, 0}; }
  const_iterator end() const { return {this, size_}; }

  void push_back(T value) { PushSlot() = std::move(value); }
  // A new back element: a slot as its last use left it (assign over it).
  T& PushSlot() {
    if (size_ == slots_.size()) Grow(std::max<size_t>(16, 2 * slots_.size()));
    ++size_;
    return (*this)[size_ - 1];
  }
  void pop_front() {
    head_ = (head_ + 1) % slots_.size();
    --size_;
  }
  void pop_back() { --size_; }
  void clear() {
    head_ = 0;
    size_ = 0;
  }
  // Room for `n` elements without growing.
  void Reserve(size_t n) {
    if (n > slots_.size()) Grow(n);
  }
  // The same, each slot default-constructed, then `init` applied (a
  // string's reserve, say), so that later pushes reuse what it gave them.
  template <class Init>
  void Reserve(size_t n, Init init) {
    if (n > slots_.size()) Grow(n);
    for (T& slot : slots_) init(slot);
  }

 private:
  void Grow(size_t capacity) {
    std::vector<T> bigger(capacity);
    for (size_t i = 0; i < size_; ++i) bigger[i] = std::move((*this)[i]);
    slots_ = std::move(bigger);
    head_ = 0;
  }

  std::vector<T> slots_;
  size_t head_ = 0;
  size_t size_ = 0;
};

}  // namespace ferry::scheduler
