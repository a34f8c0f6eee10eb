#include "common/metrics.h"

#include <prometheus/exposer.h>
#include <prometheus/text_serializer.h>

namespace ferry {

MetricsServer::MetricsServer(const std::string& bind)
    : registry_(std::make_shared<prometheus::Registry>()),
      exposer_(std::make_unique<prometheus::Exposer>(bind)) {
  exposer_->RegisterCollectable(registry_);
}

MetricsServer::~MetricsServer() = default;

int MetricsServer::port() const {
  auto ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

std::string MetricsServer::Text() const { return prometheus::TextSerializer().Serialize(registry_->Collect()); }

prometheus::Histogram::BucketBoundaries LatencyBucketsSeconds() {
  return {0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60};
}

}  // namespace ferry
