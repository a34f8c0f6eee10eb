#include "gateway/lanes.h"

#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace ferry::gateway {

LaneTable LaneTable::Defaults() {
  return LaneTable({{"interactive", 10, 256, 5'000, 120'000, 0}, {"batch", 0, 4096, 600'000, 3'600'000, 0}},
                   "interactive");
}

LaneTable::LaneTable(std::vector<Lane> lanes, std::string default_lane)
    : lanes_(std::move(lanes)), default_lane_(std::move(default_lane)) {}

LaneTable LaneTable::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot read the lanes file");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": not JSON: " + e.what());
  }
  if (!j.contains("lanes") || !j["lanes"].is_array() || j["lanes"].empty()) {
    throw std::runtime_error(path + ": \"lanes\" must be a non-empty list");
  }
  std::vector<Lane> lanes;
  for (size_t i = 0; i < j["lanes"].size(); ++i) {
    const auto& l = j["lanes"][i];
    const std::string where = path + ": lanes[" + std::to_string(i) + "]";
    if (!l.contains("name") || !l["name"].is_string() || l["name"].get<std::string>().empty()) {
      throw std::runtime_error(where + ".name must be a non-empty string");
    }
    try {
      Lane lane;
      lane.name = l["name"];
      lane.priority = l.value("priority", 0);
      lane.max_queued = l.value("max_queued", 1024);
      lane.queue_timeout_ms = l.value("queue_timeout_ms", 0);
      lane.default_deadline_ms = l.value("default_deadline_ms", int64_t{0});
      lane.max_tokens = l.value("max_tokens", 0);
      if (lane.max_queued < 0 || lane.queue_timeout_ms < 0 || lane.default_deadline_ms < 0 || lane.max_tokens < 0) {
        throw std::runtime_error("limits must be >= 0");
      }
      lanes.push_back(lane);
    } catch (const std::exception& e) {
      throw std::runtime_error(where + ": " + e.what());
    }
  }
  const std::string default_lane = j.value("default", lanes.front().name);
  LaneTable table(std::move(lanes), default_lane);
  if (!table.Find("")) throw std::runtime_error(path + ": default lane \"" + default_lane + "\" is not defined");
  return table;
}

std::optional<Lane> LaneTable::Find(std::string_view name) const {
  if (name.empty()) name = default_lane_;
  for (const Lane& lane : lanes_) {
    if (lane.name == name) return lane;
  }
  return std::nullopt;
}

std::string LaneTable::Names() const {
  std::string out;
  for (const Lane& lane : lanes_) out += (out.empty() ? "" : ", ") + lane.name;
  return out;
}

LaneQueues::LaneQueues(const LaneTable& lanes) {
  for (const Lane& lane : lanes.lanes()) queued_[lane.name] = 0;
}

std::optional<LaneQueues::Ticket> LaneQueues::TryEnter(const Lane& lane) {
  std::lock_guard lock(mu_);
  int32_t& n = queued_[lane.name];
  if (lane.max_queued > 0 && n >= lane.max_queued) return std::nullopt;
  ++n;
  return Ticket(this, lane.name);
}

LaneQueues::Ticket& LaneQueues::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    Release();
    owner_ = std::exchange(other.owner_, nullptr);
    lane_ = std::move(other.lane_);
  }
  return *this;
}

void LaneQueues::Ticket::Release() {
  if (owner_ == nullptr) return;
  std::lock_guard lock(owner_->mu_);
  --owner_->queued_[lane_];
  owner_ = nullptr;
}

}  // namespace ferry::gateway
