#include "scheduler/sim/trace_family.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>

#include "scheduler/sim/rng.h"
#include "scheduler/sim/scenarios.h"

namespace ferry::sim {
namespace {

// Log-normal with the given median and log-space spread; LengthDist takes
// the mean (median * exp(sigma^2 / 2)).
LengthDist LogNormal(double median, double sigma, int32_t min, int32_t max) {
  return LengthDist{median * std::exp(0.5 * sigma * sigma), sigma, min, max};
}

// Prompt + output stay under the sim's max_model_len (4096): 3000 + 1024.
struct LengthProfile {
  LengthDist prompt, output;
  int32_t prefix_tokens = 0;
};

// Chat: prompts of a few hundred tokens with a wide spread, answers of one
// to a few hundred, system prompts as the shared prefixes. RAG: prompts of
// 1,200-2,400 tokens (retrieved documents), short answers, the documents as
// the shared prefixes.
LengthProfile DrawLengths(Rng& rng, bool is_rag) {
  LengthProfile p;
  if (is_rag) {
    p.prompt = LogNormal(rng.Uniform(1200, 2400), rng.Uniform(0.2, 0.5), 256, 3000);
    p.output = LogNormal(rng.Uniform(30, 200), rng.Uniform(0.3, 0.7), 4, 1024);
    p.prefix_tokens = static_cast<int32_t>(rng.Uniform(512, 1536));
  } else {
    p.prompt = LogNormal(rng.Uniform(150, 800), rng.Uniform(0.3, 0.9), 16, 3000);
    p.output = LogNormal(rng.Uniform(60, 300), rng.Uniform(0.3, 0.8), 4, 1024);
    p.prefix_tokens = static_cast<int32_t>(rng.Uniform(64, 512));
  }
  return p;
}

// The arrival process's shape; rate_per_s is set afterwards from the load.
ArrivalOptions DrawArrivals(Rng& rng) {
  constexpr ArrivalKind kKinds[] = {ArrivalKind::kPoisson, ArrivalKind::kBursty, ArrivalKind::kDiurnal,
                                    ArrivalKind::kSpike, ArrivalKind::kOnOff};
  ArrivalOptions a;
  a.duration_s = kFamilyDurationS;
  a.kind = kKinds[std::min<size_t>(4, static_cast<size_t>(rng.Uniform() * 5))];
  const double d = a.duration_s;
  switch (a.kind) {
    case ArrivalKind::kPoisson: break;
    case ArrivalKind::kBursty: a.burst_cv = rng.Uniform(1.0, 4.0); break;
    case ArrivalKind::kDiurnal:
      a.diurnal_period_s = rng.Uniform(d / 4, 2 * d);
      a.diurnal_amplitude = rng.Uniform(0.2, 0.9);
      a.diurnal_phase_rad = rng.Uniform(0, 2 * std::numbers::pi);
      break;
    case ArrivalKind::kSpike:
      a.spike_multiplier = rng.Uniform(2.0, 5.0);
      a.spike_duration_s = rng.Uniform(0.05 * d, 0.3 * d);
      a.spike_start_s = rng.Uniform(0.1 * d, 0.95 * d - a.spike_duration_s);
      a.spike_lane = "";  // every lane scales: the spike is more of the same traffic
      break;
    case ArrivalKind::kOnOff:
      a.onoff_on_mean_s = rng.Uniform(2, 15);
      a.onoff_off_mean_s = rng.Uniform(2, 15);
      a.onoff_off_share = rng.Uniform(0, 0.3);
      break;
  }
  return a;
}

// Mean of RateAt over [0, duration] per unit of rate_per_s, so that the drawn
// load is the whole window's mean rate over capacity, whatever the shape.
double MeanRateFactor(const ArrivalOptions& a) {
  const double d = a.duration_s;
  switch (a.kind) {
    case ArrivalKind::kDiurnal: {
      const double w = 2 * std::numbers::pi / a.diurnal_period_s;
      return 1.0 - a.diurnal_amplitude *
                       (std::sin(w * d + a.diurnal_phase_rad) - std::sin(a.diurnal_phase_rad)) / (w * d);
    }
    case ArrivalKind::kSpike: return 1.0 + (a.spike_multiplier - 1.0) * a.spike_duration_s / d;
    default: return 1.0;  // bursty and on-off take rate_per_s as their long-run mean
  }
}

// Time of one step of the given shape.
double Step(const CostModel& cost, int64_t tokens, int32_t seqs, int64_t kv_tokens) {
  return cost.StepSeconds(StepShape{tokens, seqs, kv_tokens});
}

// Seconds to serve a batch of `b` requests as ReferenceCapacityPerS describes.
double BatchSeconds(const CostModel& cost, int32_t budget, double prompt, double output, int32_t b) {
  double total = 0;
  const int64_t prefill = std::llround(b * prompt);
  for (int64_t done = 0; done < prefill; done += budget) {
    const int64_t chunk = std::min<int64_t>(budget, prefill - done);
    const int32_t seqs = std::clamp(static_cast<int32_t>(std::ceil(chunk / prompt)), 1, b);
    total += Step(cost, chunk, seqs, chunk);
  }
  const int64_t kv = std::llround(b * (prompt + 0.5 * output));
  return total + output * Step(cost, b, b, kv);
}

}  // namespace

double ReferenceCapacityPerS(const CostModel& cost, const scheduler::SchedulerConfig& config,
                             double mean_prompt_tokens, double mean_output_tokens, double reference_tpot_s,
                             int32_t* num_seqs) {
  const double pool_tokens = static_cast<double>(config.num_kv_blocks) * config.block_size;
  int32_t best = 1;
  for (int32_t b = 1; b <= kCapacityMaxNumSeqs; ++b) {
    if (b * (mean_prompt_tokens + mean_output_tokens) > pool_tokens) break;
    const double t = BatchSeconds(cost, config.max_num_batched_tokens, mean_prompt_tokens, mean_output_tokens, b);
    if (t / mean_output_tokens <= reference_tpot_s) best = b;
  }
  if (num_seqs != nullptr) *num_seqs = best;
  return best / BatchSeconds(cost, config.max_num_batched_tokens, mean_prompt_tokens, mean_output_tokens, best);
}

FamilyMember DrawFamilyMember(uint64_t seed, const CostModelParams& preset) {
  // Mixed so that neighbouring seeds share no mt19937_64 state.
  Rng rng(seed * 0x9E3779B97F4A7C15ull + 0x5EED);
  FamilyMember m;
  m.seed = seed;
  WorkloadOptions& w = m.workload;
  w.arrivals = DrawArrivals(rng);
  const bool is_rag = rng.Uniform() < 0.5;
  m.length_mix = is_rag ? "rag" : "chat";
  const LengthProfile lengths = DrawLengths(rng, is_rag);
  m.interactive_share = rng.Uniform(0.1, 0.6);
  m.prefix_share = rng.Uniform(0.0, 0.5);
  const int32_t num_prefixes = 1 + static_cast<int32_t>(rng.Uniform() * 8);
  m.load = rng.Uniform(kFamilyMinLoad, kFamilyMaxLoad);
  w.seed = rng.Bits();
  w.lanes.clear();  // WorkloadOptions starts with one "default" lane
  // The same lengths and prefixes in both lanes: the lanes differ in priority
  // and SLO, not in what they ask.
  for (const auto& [name, share] : {std::pair<const char*, double>{"interactive", m.interactive_share},
                                    {"batch", 1.0 - m.interactive_share}}) {
    LaneMix lane{name, share, lengths.prompt, lengths.output};
    lane.prefix_share = m.prefix_share;
    lane.num_prefixes = num_prefixes;
    lane.prefix_tokens = lengths.prefix_tokens;
    w.lanes.push_back(lane);
  }
  m.mean_prompt_tokens = lengths.prompt.mean;
  m.mean_output_tokens = lengths.output.mean;
  const CostModel cost(preset);
  m.capacity_per_s = ReferenceCapacityPerS(cost, DefaultSchedulerConfig(preset), m.mean_prompt_tokens,
                                           m.mean_output_tokens, kCapacityReferenceTpotS, &m.capacity_num_seqs);
  w.arrivals.rate_per_s = m.load * m.capacity_per_s / MeanRateFactor(w.arrivals);
  return m;
}

std::vector<TraceRequest> GenerateFamilyTrace(const FamilyMember& member) {
  return GenerateWorkload(member.workload);
}

std::string DescribeMember(const FamilyMember& m) {
  const ArrivalOptions& a = m.workload.arrivals;
  char shape[160] = "";
  switch (a.kind) {
    case ArrivalKind::kPoisson: break;
    case ArrivalKind::kBursty: std::snprintf(shape, sizeof(shape), " cv %.2f", a.burst_cv); break;
    case ArrivalKind::kDiurnal:
      std::snprintf(shape, sizeof(shape), " period %.0f s amplitude %.2f phase %.2f", a.diurnal_period_s,
                    a.diurnal_amplitude, a.diurnal_phase_rad);
      break;
    case ArrivalKind::kSpike:
      std::snprintf(shape, sizeof(shape), " %.1fx at %.0f s for %.0f s", a.spike_multiplier, a.spike_start_s,
                    a.spike_duration_s);
      break;
    case ArrivalKind::kOnOff:
      std::snprintf(shape, sizeof(shape), " on %.1f s off %.1f s (%.2f of the rate)", a.onoff_on_mean_s,
                    a.onoff_off_mean_s, a.onoff_off_share);
      break;
  }
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "seed %llu: %s%s; %s, prompt ~%.0f, output ~%.0f; %.0f%% interactive, %.0f%% prefixed; "
                "load %.2f of %.1f req/s (batch %d) = %.1f req/s mean",
                static_cast<unsigned long long>(m.seed), ArrivalKindName(a.kind), shape, m.length_mix.c_str(),
                m.mean_prompt_tokens, m.mean_output_tokens, 100 * m.interactive_share, 100 * m.prefix_share,
                m.load, m.capacity_per_s, m.capacity_num_seqs, m.load * m.capacity_per_s);
  return buf;
}

}  // namespace ferry::sim
