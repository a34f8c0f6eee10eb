// A small, thread-safe cache of compiled structured-output constraints by their text. One
// request is checked where it enters (HTTP parse, gateway validation), at the scheduler and at
// the worker (step validation, then its matcher), once per choice when it asks for n of them,
// and a large regex's DFA takes tens of milliseconds to build: each process compiles a text once.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace ferry {

template <class T>
class CompileCache {
 public:
  explicit CompileCache(size_t capacity) : capacity_(capacity) {}

  // The compiled form of text; compile(text) runs outside the lock, and what it throws (a bad
  // text) passes to the caller and is not kept.
  template <class Compile>
  std::shared_ptr<const T> Get(const std::string& text, Compile compile) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = entries_.find(text); it != entries_.end()) return it->second;
    }
    auto compiled = std::make_shared<const T>(compile(text));
    std::lock_guard<std::mutex> lock(mu_);
    if (entries_.size() >= capacity_) entries_.clear();  // holders keep theirs by shared pointer
    entries_.emplace(text, compiled);
    return compiled;
  }

 private:
  const size_t capacity_;
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const T>> entries_;
};

}  // namespace ferry
