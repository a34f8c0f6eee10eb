// Priority lanes. A lane maps a name clients use to the priority the scheduler
// orders by. Queue bounds, timeouts and tenants per lane come with the gateway
// issue; the table's shape already allows them.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::gateway {

struct Lane {
  std::string name;
  int priority = 0;  // larger runs first
};

class LaneTable {
 public:
  // interactive (priority 10, the default) and batch (priority 0).
  static LaneTable Defaults() {
    return LaneTable({{"interactive", 10}, {"batch", 0}}, "interactive");
  }
  LaneTable(std::vector<Lane> lanes, std::string default_lane)
      : lanes_(std::move(lanes)), default_lane_(std::move(default_lane)) {}

  // Empty name: the default lane.
  std::optional<Lane> Find(std::string_view name) const {
    if (name.empty()) name = default_lane_;
    for (const Lane& lane : lanes_) {
      if (lane.name == name) return lane;
    }
    return std::nullopt;
  }

  std::string Names() const {
    std::string out;
    for (const Lane& lane : lanes_) out += (out.empty() ? "" : ", ") + lane.name;
    return out;
  }

 private:
  std::vector<Lane> lanes_;
  std::string default_lane_;
};

}  // namespace ferry::gateway
