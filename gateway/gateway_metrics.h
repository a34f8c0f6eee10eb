// The gateway's Prometheus series (docs/metrics.md), shared by the Generator and its calls.
// Internal to the gateway's logic: fronts never see it.
#pragma once

#include <map>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "common/metrics.h"
#include "ferry/v1/generation.pb.h"
#include "gateway/lanes.h"
#include "gateway/status.h"

namespace ferry::gateway {

// "length", "eos", ...: the enum name without its prefix, in lower case.
std::string FinishReasonLabel(ferry::v1::FinishReason reason);
// "OK", "CANCELLED", ...: a status code as the requests counter labels it (gRPC's names).
std::string StatusCodeName(StatusCode code);
// A request's lane as a label: the configured lane its `lane` field names, else "unknown". Only
// configured names become label values: a client cannot grow the series.
inline std::string LaneLabel(const LaneTable& lanes, std::string_view name) {
  auto lane = lanes.Find(name);
  return lane ? lane->name : "unknown";
}

// One lane's series, made when the Generator starts so that every lane shows (at 0) before
// its first request and the hot path never looks labels up.
struct LaneSeries {
  prometheus::Gauge& waiting;  // submitted, not yet scheduled
  prometheus::Gauge& running;  // scheduled, generating
  prometheus::Histogram& ttft;
  prometheus::Histogram& e2e;
  prometheus::Histogram& queue_time;
  prometheus::Histogram& inter_token;
  prometheus::Histogram& time_per_output_token;
  prometheus::Counter& prompt_tokens;
  prometheus::Counter& completion_tokens;
  std::map<ferry::v1::FinishReason, prometheus::Counter*> finished;
};

struct GatewayMetrics {
  GatewayMetrics(prometheus::Registry& r, const LaneTable& lanes)
      : requests(prometheus::BuildCounter().Name("ferry_gateway_requests_total")
                     .Help("Requests answered, by lane and gRPC status code").Register(r)),
        rejections(prometheus::BuildCounter().Name("ferry_gateway_rejections_total")
                       .Help("Requests refused before reaching the scheduler, by reason").Register(r)),
        invalid(rejections.Add({{"reason", "invalid"}})),
        lane_full(rejections.Add({{"reason", "lane_full"}})),
        auth_refused(rejections.Add({{"reason", "auth"}})),
        rate_limited(rejections.Add({{"reason", "rate_limit"}})),
        ttft(prometheus::BuildHistogram().Name("ferry_gateway_time_to_first_token_seconds")
                 .Help("Arrival to first token, by lane").Register(r)),
        e2e(prometheus::BuildHistogram().Name("ferry_gateway_request_duration_seconds")
                .Help("Arrival to last token of requests that finished, by lane").Register(r)),
        queue_time(prometheus::BuildHistogram().Name("ferry_gateway_queue_time_seconds")
                       .Help("Time waiting in the scheduler's queue before the first step, by lane").Register(r)),
        inter_token(prometheus::BuildHistogram().Name("ferry_gateway_inter_token_latency_seconds")
                        .Help("Time between successive token deliveries of one request, by lane").Register(r)),
        time_per_output_token(prometheus::BuildHistogram().Name("ferry_gateway_time_per_output_token_seconds")
                                  .Help("(last token - first token) / (completion tokens - 1) per request, by lane")
                                  .Register(r)),
        tokens(prometheus::BuildCounter().Name("ferry_gateway_tokens_total")
                   .Help("Prompt and completion tokens of answered requests, by lane").Register(r)),
        finished(prometheus::BuildCounter().Name("ferry_gateway_requests_finished_total")
                     .Help("Requests that ended with a finish reason, by lane and reason").Register(r)),
        in_flight(prometheus::BuildGauge().Name("ferry_gateway_requests_in_flight")
                      .Help("Requests being served, by lane and state (waiting: not yet scheduled)").Register(r)),
        migrations(prometheus::BuildCounter().Name("ferry_gateway_migrations_total")
                       .Help("Started requests whose scheduler was lost: resumed elsewhere, or ended past "
                             "--migration-limit")
                       .Register(r)),
        resumed(migrations.Add({{"outcome", "resumed"}})),
        adapter_requests(prometheus::BuildCounter().Name("ferry_gateway_lora_requests_total")
                             .Help("Requests answered under a LoRA adapter, by adapter and gRPC status code")
                             .Register(r)),
        adapter_tokens(prometheus::BuildCounter().Name("ferry_gateway_lora_tokens_total")
                           .Help("Prompt and completion tokens of requests answered under a LoRA adapter, by "
                                 "adapter and kind")
                           .Register(r)),
        migration_limit(migrations.Add({{"outcome", "limit"}})) {
    for (const Lane& lane : lanes.lanes()) AddLane(lane.name);
  }

  LaneSeries& lane(const std::string& name) { return by_lane.at(name); }

  prometheus::Family<prometheus::Counter>& requests;
  prometheus::Family<prometheus::Counter>& rejections;
  prometheus::Counter& invalid;
  prometheus::Counter& lane_full;
  prometheus::Counter& auth_refused;
  prometheus::Counter& rate_limited;
  prometheus::Family<prometheus::Histogram>& ttft;
  prometheus::Family<prometheus::Histogram>& e2e;
  prometheus::Family<prometheus::Histogram>& queue_time;
  prometheus::Family<prometheus::Histogram>& inter_token;
  prometheus::Family<prometheus::Histogram>& time_per_output_token;
  prometheus::Family<prometheus::Counter>& tokens;
  prometheus::Family<prometheus::Counter>& finished;
  prometheus::Family<prometheus::Gauge>& in_flight;
  prometheus::Family<prometheus::Counter>& migrations;
  prometheus::Counter& resumed;
  prometheus::Counter& migration_limit;
  // Per LoRA adapter (issue #57): a series appears with an adapter's first request.
  prometheus::Family<prometheus::Counter>& adapter_requests;
  prometheus::Family<prometheus::Counter>& adapter_tokens;
  std::map<std::string, LaneSeries> by_lane;  // filled once, read-only afterwards

 private:
  void AddLane(const std::string& name) {
    const prometheus::Labels lane{{"lane", name}};
    const auto buckets = LatencyBucketsSeconds();
    LaneSeries series{in_flight.Add({{"lane", name}, {"state", "waiting"}}),
                      in_flight.Add({{"lane", name}, {"state", "running"}}),
                      ttft.Add(lane, buckets),
                      e2e.Add(lane, buckets),
                      queue_time.Add(lane, buckets),
                      inter_token.Add(lane, buckets),
                      time_per_output_token.Add(lane, buckets),
                      tokens.Add({{"lane", name}, {"kind", "prompt"}}),
                      tokens.Add({{"lane", name}, {"kind", "completion"}}),
                      {}};
    for (auto reason : {ferry::v1::FINISH_REASON_STOP, ferry::v1::FINISH_REASON_LENGTH, ferry::v1::FINISH_REASON_EOS,
                        ferry::v1::FINISH_REASON_TIMEOUT}) {
      series.finished[reason] = &finished.Add({{"lane", name}, {"reason", FinishReasonLabel(reason)}});
    }
    by_lane.emplace(name, std::move(series));
  }
};

}  // namespace ferry::gateway
