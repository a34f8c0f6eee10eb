// The standard Prometheus process metrics, named as the official client libraries name them
// (Go's and Python's process collector), which prometheus-cpp does not provide: every Ferry
// service exports them beside its own series (common/metrics.cc registers them), so CPU time per
// process can be read and compared under load (ferry-bench's CPU per 1,000 tokens).
//
// Read from /proc/self at each scrape (Linux): nothing runs between scrapes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include <prometheus/collectable.h>

namespace ferry {

// One reading of this process.
struct ProcessStats {
  double cpu_seconds = 0;          // user + system CPU time since start
  int64_t resident_bytes = 0;      // resident set size
  int64_t virtual_bytes = 0;       // virtual memory size
  int64_t open_fds = 0;            // entries in /proc/self/fd
  int64_t max_fds = 0;             // the soft RLIMIT_NOFILE
  double start_time_seconds = 0;   // since the Unix epoch
};

// nullopt where /proc cannot be read (not Linux, or a sandbox without it).
std::optional<ProcessStats> ReadProcessStats();

// process_cpu_seconds_total, process_resident_memory_bytes, process_virtual_memory_bytes,
// process_open_fds, process_max_fds, process_start_time_seconds; none where /proc is unreadable.
std::shared_ptr<prometheus::Collectable> MakeProcessCollector();

}  // namespace ferry
