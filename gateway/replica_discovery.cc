#include "gateway/replica_discovery.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

namespace ferry::gateway {
namespace {

std::string Trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

// NAME:PORT split at the last colon; throws std::invalid_argument naming the flag.
std::pair<std::string, std::string> SplitHostPort(const std::string& address, const std::string& where) {
  const auto colon = address.rfind(':');
  const std::string port = colon == std::string::npos ? "" : address.substr(colon + 1);
  const bool digits = !port.empty() && std::all_of(port.begin(), port.end(), ::isdigit);
  if (colon == 0 || !digits || std::stoul(port) > 65535) {
    throw std::invalid_argument(fmt::format("{} \"{}\": not host:port", where, address));
  }
  return {address.substr(0, colon), port};
}

// Every address NAME resolves to, as ip:port; an empty set when it has no record; nullopt (error
// set) when the resolver failed otherwise.
std::optional<std::vector<std::string>> Resolve(const std::string& name_port, std::string* error) {
  const auto [name, port] = SplitHostPort(name_port, "--scheduler-dns");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(name.c_str(), port.c_str(), &hints, &found);
  if (rc == EAI_NONAME || rc == EAI_NODATA) return std::vector<std::string>{};
  if (rc != 0) {
    *error = fmt::format("--scheduler-dns {}: {}", name_port, ::gai_strerror(rc));
    return std::nullopt;
  }
  std::vector<std::string> out;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char ip[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr, ip, sizeof ip);
      out.push_back(fmt::format("{}:{}", ip, port));
    } else if (a->ai_family == AF_INET6) {
      ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr, ip, sizeof ip);
      out.push_back(fmt::format("[{}]:{}", ip, port));
    }
  }
  ::freeaddrinfo(found);
  return out;
}

}  // namespace

std::vector<std::string> ParseSchedulerFile(const std::string& text, const std::string& path) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    line = Trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    SplitHostPort(line, fmt::format("--scheduler-file {} line {}", path, n));
    out.push_back(line);
  }
  return out;
}

std::optional<std::vector<std::string>> Discover(const DiscoverySources& sources, std::string* error) {
  std::set<std::string> all(sources.static_addresses.begin(), sources.static_addresses.end());
  if (!sources.file.empty()) {
    std::ifstream in(sources.file);
    if (!in) {
      *error = fmt::format("--scheduler-file {}: cannot be read", sources.file);
      return std::nullopt;
    }
    std::stringstream text;
    text << in.rdbuf();
    try {
      for (std::string& a : ParseSchedulerFile(text.str(), sources.file)) all.insert(std::move(a));
    } catch (const std::invalid_argument& e) {
      *error = e.what();  // a file being written, or a typo: keep what was listed
      return std::nullopt;
    }
  }
  if (!sources.dns.empty()) {
    auto resolved = Resolve(sources.dns, error);
    if (!resolved) return std::nullopt;
    all.insert(resolved->begin(), resolved->end());
  }
  return std::vector<std::string>(all.begin(), all.end());
}

ReplicaDiscovery::ReplicaDiscovery(DiscoverySources sources, std::shared_ptr<DynamicSchedulerClient> client,
                                   std::vector<std::string> current, std::chrono::milliseconds interval,
                                   std::function<void(const std::string&)> on_added)
    : sources_(std::move(sources)), client_(std::move(client)), on_added_(std::move(on_added)),
      current_(std::move(current)) {
  std::sort(current_.begin(), current_.end());
  thread_ = std::thread([this, interval] {
    std::unique_lock lock(mu_);
    while (!cv_.wait_for(lock, interval, [&] { return stopping_; })) {
      lock.unlock();
      PollOnce();
      lock.lock();
    }
  });
}

ReplicaDiscovery::~ReplicaDiscovery() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ReplicaDiscovery::PollOnce() {
  std::string error;
  auto found = Discover(sources_, &error);
  if (!found) {
    if (error != last_error_) spdlog::warn("replica discovery: {}; the replicas stay as they are", error);
    last_error_ = error;
    return;
  }
  last_error_.clear();
  if (*found == current_) return;
  spdlog::info("replica discovery: {} scheduler replica(s): {}", found->size(), fmt::join(*found, ", "));
  try {
    client_->SetReplicas(*found);
  } catch (const std::exception& e) {
    spdlog::warn("replica discovery: {}", e.what());
  }
  if (on_added_) {
    for (const std::string& address : *found) {
      if (!std::binary_search(current_.begin(), current_.end(), address)) on_added_(address);
    }
  }
  current_ = std::move(*found);
}

}  // namespace ferry::gateway
