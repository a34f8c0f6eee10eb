#include "scheduler/lora_table.h"

#include <algorithm>
#include <stdexcept>

namespace ferry::scheduler {

LoraTable::LoraTable(const std::vector<std::string>& start_names) {
  for (const std::string& name : start_names) {
    served_[name] = name;
    keys_[name] = Entry{name, ""};
  }
}

std::optional<std::string> LoraTable::Key(const std::string& name) const {
  const auto it = served_.find(name);
  if (it == served_.end()) return std::nullopt;
  return it->second;
}

void LoraTable::Add(const std::string& name, const std::string& key, const std::string& path) {
  if (served_.count(name) || keys_.count(key)) throw std::logic_error("LoraTable::Add: " + name + " as " + key + " is known");
  served_[name] = key;
  keys_[key] = Entry{name, path};
}

void LoraTable::AddRetiring(const std::string& name, const std::string& key, const std::string& path) {
  if (keys_.count(key)) throw std::logic_error("LoraTable::AddRetiring: " + key + " is known");
  keys_[key] = Entry{name, path};
  retiring_.push_back(key);
}

std::string LoraTable::Remove(const std::string& name) {
  const auto it = served_.find(name);
  if (it == served_.end()) throw std::logic_error("LoraTable::Remove: " + name + " is not served");
  std::string key = it->second;
  served_.erase(it);
  retiring_.push_back(key);
  return key;
}

void LoraTable::Dropped(const std::string& key) {
  retiring_.erase(std::remove(retiring_.begin(), retiring_.end(), key), retiring_.end());
  keys_.erase(key);
}

const std::string& LoraTable::NameOf(const std::string& key) const {
  const auto it = keys_.find(key);
  return it == keys_.end() ? key : it->second.name;
}

std::vector<std::string> LoraTable::Names() const {
  std::vector<std::string> out;
  out.reserve(served_.size());
  for (const auto& [name, key] : served_) out.push_back(name);
  return out;  // a std::map's order: sorted
}

std::vector<std::pair<std::string, std::string>> LoraTable::RuntimeLoads() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [key, entry] : keys_) {
    if (!entry.path.empty()) out.emplace_back(key, entry.path);
  }
  return out;
}

}  // namespace ferry::scheduler
