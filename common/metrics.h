// One Prometheus registry and HTTP exposer per process, which also serves the standard process
// metrics (common/process_metrics.h). Binding port 0 lets the kernel choose; port() tells which
// (for the ready file).
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

namespace prometheus {
class Exposer;
}

namespace ferry {

class MetricsServer {
 public:
  // bind: "host:port", e.g. "127.0.0.1:0". Throws on failure to bind.
  explicit MetricsServer(const std::string& bind);
  ~MetricsServer();

  prometheus::Registry& registry() { return *registry_; }
  int port() const;
  // The registry and the process metrics in Prometheus' text format (what /metrics serves), for a
  // second endpoint such as the gateway's OpenAI HTTP port.
  std::string Text() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<prometheus::Collectable> process_;  // common/process_metrics.h
  std::unique_ptr<prometheus::Exposer> exposer_;
};

// Histogram buckets from 1 ms to 60 s, roughly x2 apart: resolve both fast
// decode steps and long generations.
prometheus::Histogram::BucketBoundaries LatencyBucketsSeconds();

}  // namespace ferry
