#include "common/metrics.h"

#include <prometheus/exposer.h>
#include <prometheus/text_serializer.h>

#include "common/process_metrics.h"

namespace ferry {

MetricsServer::MetricsServer(const std::string& bind)
    : registry_(std::make_shared<prometheus::Registry>()),
      process_(MakeProcessCollector()),
      exposer_(std::make_unique<prometheus::Exposer>(bind)) {
  exposer_->RegisterCollectable(registry_);
  exposer_->RegisterCollectable(process_);
}

MetricsServer::~MetricsServer() = default;

int MetricsServer::port() const {
  auto ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

std::string MetricsServer::Text() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  for (auto& family : process_->Collect()) families.push_back(std::move(family));
  return prometheus::TextSerializer().Serialize(families);
}

prometheus::Histogram::BucketBoundaries LatencyBucketsSeconds() {
  return {0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60};
}

}  // namespace ferry
