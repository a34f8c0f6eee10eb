#include "scheduler/sim/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numbers>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "scheduler/sim/rng.h"

namespace ferry::sim {
namespace {

int32_t SampleLength(Rng& rng, const LengthDist& d) {
  double x = d.mean;
  if (d.sigma > 0) x = d.mean * std::exp(d.sigma * rng.Normal() - 0.5 * d.sigma * d.sigma);
  return std::clamp(static_cast<int32_t>(std::lround(x)), d.min, d.max);
}

double RateAt(const ArrivalOptions& a, double t) {
  switch (a.kind) {
    case ArrivalKind::kDiurnal:
      return a.rate_per_s *
             (1.0 - a.diurnal_amplitude *
                        std::cos(2.0 * std::numbers::pi * t / a.diurnal_period_s + a.diurnal_phase_rad));
    case ArrivalKind::kSpike:
      return (t >= a.spike_start_s && t < a.spike_start_s + a.spike_duration_s)
                 ? a.rate_per_s * a.spike_multiplier
                 : a.rate_per_s;
    default: return a.rate_per_s;
  }
}

// Alternating exponential on/off periods, each a Poisson segment at its rate.
std::vector<double> OnOffArrivalTimes(const ArrivalOptions& a, Rng& rng) {
  if (!(a.onoff_on_mean_s > 0) || !(a.onoff_off_mean_s > 0) || !(a.onoff_off_share >= 0) ||
      !(a.onoff_off_share <= 1)) {
    throw std::invalid_argument("on-off: onoff_on_mean_s and onoff_off_mean_s must be > 0, "
                                "onoff_off_share in [0, 1]");
  }
  const double on_fraction = a.onoff_on_mean_s / (a.onoff_on_mean_s + a.onoff_off_mean_s);
  const double on_rate = a.rate_per_s / (on_fraction + (1.0 - on_fraction) * a.onoff_off_share);
  std::vector<double> times;
  bool is_on = true;
  for (double start = 0; start < a.duration_s; is_on = !is_on) {
    const double end = std::min(a.duration_s, start + rng.Exponential(1.0 / (is_on ? a.onoff_on_mean_s
                                                                                    : a.onoff_off_mean_s)));
    const double rate = is_on ? on_rate : on_rate * a.onoff_off_share;
    for (double t = start; rate > 0;) {
      t += rng.Exponential(rate);
      if (t >= end) break;
      times.push_back(t);
    }
    start = end;
  }
  return times;
}

std::vector<double> ArrivalTimes(const ArrivalOptions& a, Rng& rng) {
  if (!(a.rate_per_s > 0) || !(a.duration_s > 0)) {
    throw std::invalid_argument("workload rate_per_s and duration_s must be > 0");
  }
  if (a.kind == ArrivalKind::kOnOff) return OnOffArrivalTimes(a, rng);
  std::vector<double> times;
  if (a.kind == ArrivalKind::kBursty) {
    const double shape = 1.0 / (a.burst_cv * a.burst_cv);  // cv of gamma = 1/sqrt(shape)
    for (double t = 0;;) {
      t += rng.Gamma(shape) / (shape * a.rate_per_s);
      if (t >= a.duration_s) break;
      times.push_back(t);
    }
    return times;
  }
  // Thinning (Lewis-Shedler) against the peak rate.
  double peak = a.rate_per_s;
  if (a.kind == ArrivalKind::kDiurnal) peak *= 1.0 + a.diurnal_amplitude;
  if (a.kind == ArrivalKind::kSpike) peak *= std::max(1.0, a.spike_multiplier);
  for (double t = 0;;) {
    t += rng.Exponential(peak);
    if (t >= a.duration_s) break;
    if (rng.Uniform() * peak < RateAt(a, t)) times.push_back(t);
  }
  return times;
}

const LaneMix* PickLane(const std::vector<LaneMix>& lanes, double total_share, Rng& rng) {
  double pick = rng.Uniform() * total_share;
  for (const LaneMix& l : lanes) {
    if (pick < l.share) return &l;
    pick -= l.share;
  }
  return &lanes.back();
}

}  // namespace

const char* ArrivalKindName(ArrivalKind kind) {
  switch (kind) {
    case ArrivalKind::kPoisson: return "poisson";
    case ArrivalKind::kBursty: return "bursty";
    case ArrivalKind::kDiurnal: return "diurnal";
    case ArrivalKind::kSpike: return "spike";
    case ArrivalKind::kOnOff: return "on-off";
  }
  return "?";
}

ArrivalKind ParseArrivalKind(const std::string& name) {
  for (ArrivalKind k : {ArrivalKind::kPoisson, ArrivalKind::kBursty, ArrivalKind::kDiurnal,
                        ArrivalKind::kSpike, ArrivalKind::kOnOff}) {
    if (name == ArrivalKindName(k)) return k;
  }
  throw std::invalid_argument("arrival process \"" + name +
                              "\" is not one of poisson, bursty, diurnal, spike, on-off");
}

std::vector<TraceRequest> GenerateWorkload(const WorkloadOptions& options) {
  if (options.lanes.empty()) throw std::invalid_argument("workload has no lanes");
  Rng rng(options.seed);
  double total_share = 0;
  for (const LaneMix& l : options.lanes) total_share += l.share;
  std::vector<TraceRequest> out;
  const ArrivalOptions& a = options.arrivals;
  const LaneMix* flood_lane = nullptr;
  if (a.kind == ArrivalKind::kSpike && !a.spike_lane.empty()) {
    for (const LaneMix& l : options.lanes) {
      if (l.name == a.spike_lane) flood_lane = &l;
    }
    if (flood_lane == nullptr) {
      throw std::invalid_argument("spike_lane \"" + a.spike_lane + "\" is not a lane of the workload");
    }
  }
  for (double t : ArrivalTimes(a, rng)) {
    const LaneMix* lane = PickLane(options.lanes, total_share, rng);
    // In a bulk flood an arrival in the spike is excess with probability
    // (m - 1) / m: the other lanes keep their base rate. Drawn only when the
    // spike adds load, so the base trace (m <= 1) is unchanged.
    if (flood_lane != nullptr && a.spike_multiplier > 1 && t >= a.spike_start_s &&
        t < a.spike_start_s + a.spike_duration_s &&
        rng.Uniform() * a.spike_multiplier >= 1.0) {
      lane = flood_lane;
    }
    TraceRequest r;
    r.arrival_s = t;
    r.lane = lane->name;
    r.prompt_tokens = SampleLength(rng, lane->prompt);
    r.output_tokens = SampleLength(rng, lane->output);
    if (lane->prefix_share > 0 && lane->prefix_tokens > 0 && rng.Uniform() < lane->prefix_share) {
      r.prefix_id = static_cast<int64_t>(rng.Uniform() * std::max(1, lane->num_prefixes));
      r.prefix_tokens = std::min(lane->prefix_tokens, r.prompt_tokens);
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::string TraceLine(const TraceRequest& r) {
  nlohmann::json j = {{"arrival_s", r.arrival_s},
                      {"prompt_tokens", r.prompt_tokens},
                      {"output_tokens", r.output_tokens},
                      {"lane", r.lane}};
  if (r.prefix_id >= 0) {
    j["prefix_id"] = r.prefix_id;
    j["prefix_tokens"] = r.prefix_tokens;
  }
  return j.dump();
}

TraceRequest ParseTraceLine(const std::string& line) {
  const auto j = nlohmann::json::parse(line);
  TraceRequest r;
  r.arrival_s = j.at("arrival_s").get<double>();
  r.prompt_tokens = j.at("prompt_tokens").get<int32_t>();
  r.output_tokens = j.at("output_tokens").get<int32_t>();
  r.lane = j.value("lane", std::string("default"));
  r.prefix_id = j.value("prefix_id", int64_t{-1});
  r.prefix_tokens = j.value("prefix_tokens", r.prefix_id >= 0 ? std::min(r.prompt_tokens, 256) : 0);
  if (r.prompt_tokens < 1 || r.output_tokens < 1 || r.arrival_s < 0) {
    throw std::invalid_argument("prompt_tokens and output_tokens must be >= 1, arrival_s >= 0");
  }
  r.prefix_tokens = std::clamp(r.prefix_tokens, 0, r.prompt_tokens);
  return r;
}

std::vector<TraceRequest> ReadTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read trace " + path);
  std::vector<TraceRequest> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      out.push_back(ParseTraceLine(line));
    } catch (const std::exception& e) {
      throw std::runtime_error(path + ":" + std::to_string(n) + ": " + e.what());
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const TraceRequest& a, const TraceRequest& b) { return a.arrival_s < b.arrival_s; });
  return out;
}

void WriteTrace(const std::string& path, const std::vector<TraceRequest>& requests) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write trace " + path);
  for (const TraceRequest& r : requests) out << TraceLine(r) << '\n';
}

}  // namespace ferry::sim
