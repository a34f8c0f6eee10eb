// The LoRA adapters a replica serves: the name a request uses, and the key its workers and its
// prefix cache know the adapter by. An adapter named at start (--lora-modules) keeps its name as
// key; one loaded at run time gets a key of its own, "<name>#<n>", never used twice in the
// scheduler's life, so that a name loaded again (a reload: new weights) meets neither the old
// weights on a worker nor a prefix computed under them (prefix-cache blocks are rooted at the key).
// An unloaded adapter retires: no new request gets its key, the requests accepted under it finish
// with it, and the workers drop it once no live sequence names it (EngineLoop::RetireAdapters).
// The engine loop's, on its thread alone; pure data, no I/O.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ferry::scheduler {

class LoraTable {
 public:
  // The adapters the workers serve at start, each its own key.
  explicit LoraTable(const std::vector<std::string>& start_names = {});

  // The key a new request under `name` runs with; nullopt when the name is not served.
  std::optional<std::string> Key(const std::string& name) const;
  bool Serves(const std::string& name) const { return served_.count(name) != 0; }
  // Serves `name` as `key`, read from `path` at run time. Throws std::logic_error when the name is
  // served or the key known.
  void Add(const std::string& name, const std::string& key, const std::string& path);
  // A key loaded on the workers that serves nothing (a load that lost a race for its name): it
  // retires at once.
  void AddRetiring(const std::string& name, const std::string& key, const std::string& path);
  // Stops serving `name` and returns its key, now retiring. Throws std::logic_error when the name
  // is not served.
  std::string Remove(const std::string& name);
  // Keys retired and not yet dropped by the workers.
  const std::vector<std::string>& retiring() const { return retiring_; }
  // The workers dropped `key`: forgotten.
  void Dropped(const std::string& key);
  // The name a key (served or retiring) serves; the key itself when unknown.
  const std::string& NameOf(const std::string& key) const;
  // The names served, sorted.
  std::vector<std::string> Names() const;
  // Every key loaded at run time that the workers must hold (served or retiring), with its
  // directory: what a restarted rank, which holds only its --lora-modules, is given again.
  std::vector<std::pair<std::string, std::string>> RuntimeLoads() const;

 private:
  struct Entry {
    std::string name;
    std::string path;  // empty: a --lora-modules adapter (the workers load it themselves)
  };
  std::map<std::string, std::string> served_;  // name -> key
  std::map<std::string, Entry> keys_;          // key -> entry, served or retiring
  std::vector<std::string> retiring_;
};

}  // namespace ferry::scheduler
