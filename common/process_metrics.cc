#include "common/process_metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <limits>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <prometheus/client_metric.h>
#include <prometheus/metric_family.h>
#include <prometheus/metric_type.h>

namespace ferry {

namespace {

// Boot time, seconds since the epoch ("btime" in /proc/stat): a process's start time is
// given in clock ticks after it.
std::optional<int64_t> BootTimeSeconds() {
  std::ifstream in("/proc/stat");
  for (std::string key; in >> key;) {
    if (key == "btime") {
      int64_t btime = 0;
      if (in >> btime) return btime;
      return std::nullopt;
    }
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return std::nullopt;
}

// /proc/self/stat's fields after the command name (which may hold spaces and parentheses, so the
// text after its last ')' is split): index 0 is field 3 (state).
std::optional<std::vector<std::string>> StatFields() {
  std::ifstream in("/proc/self/stat");
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream rest(line.substr(close + 1));
  std::vector<std::string> fields;
  for (std::string f; rest >> f;) fields.push_back(f);
  if (fields.size() < 22) return std::nullopt;
  return fields;
}

prometheus::MetricFamily Family(const char* name, const char* help, prometheus::MetricType type, double value) {
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  return prometheus::MetricFamily{name, help, type, {metric}};
}

class ProcessCollector final : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    const std::optional<ProcessStats> s = ReadProcessStats();
    if (!s) return {};
    using prometheus::MetricType;
    return {
        Family("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", MetricType::Counter,
               s->cpu_seconds),
        Family("process_resident_memory_bytes", "Resident memory size in bytes.", MetricType::Gauge,
               static_cast<double>(s->resident_bytes)),
        Family("process_virtual_memory_bytes", "Virtual memory size in bytes.", MetricType::Gauge,
               static_cast<double>(s->virtual_bytes)),
        Family("process_open_fds", "Number of open file descriptors.", MetricType::Gauge,
               static_cast<double>(s->open_fds)),
        Family("process_max_fds", "Maximum number of open file descriptors.", MetricType::Gauge,
               static_cast<double>(s->max_fds)),
        Family("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
               MetricType::Gauge, s->start_time_seconds),
    };
  }
};

}  // namespace

std::optional<ProcessStats> ReadProcessStats() {
  const std::optional<std::vector<std::string>> f = StatFields();
  const std::optional<int64_t> boot = BootTimeSeconds();
  if (!f || !boot) return std::nullopt;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const auto page = static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  // Fields (1-based, proc(5)): utime 14, stime 15, starttime 22, vsize 23, rss 24 (pages).
  auto field = [&](int n) { return std::stod((*f)[static_cast<size_t>(n - 3)]); };
  ProcessStats s;
  s.cpu_seconds = (field(14) + field(15)) / ticks;
  s.start_time_seconds = static_cast<double>(*boot) + field(22) / ticks;
  s.virtual_bytes = static_cast<int64_t>(field(23));
  s.resident_bytes = static_cast<int64_t>(field(24)) * page;
  std::error_code error;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", error);
       !error && it != std::filesystem::directory_iterator(); it.increment(error)) {
    ++s.open_fds;
  }
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) s.max_fds = static_cast<int64_t>(limit.rlim_cur);
  return s;
}

std::shared_ptr<prometheus::Collectable> MakeProcessCollector() { return std::make_shared<ProcessCollector>(); }

}  // namespace ferry
