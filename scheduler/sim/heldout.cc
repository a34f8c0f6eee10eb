#include "scheduler/sim/heldout.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "scheduler/sim/report.h"
#include "scheduler/sim/scenarios.h"
#include "scheduler/sim/trace_family.h"

namespace ferry::sim {
namespace {

using scheduler::ControllerMode;

static_assert(kTuningSeedEnd <= kHeldOutSeedBegin, "the tuning and held-out seed ranges overlap");

// How a cell runs: the sim's default scheduler config with the cell's
// prefix caching; the controller's targets are the cell's SLO.
SimOptions CellOptions(const CostModel& cost, ControllerMode mode, int32_t cap, double ttft_s, double tpot_s,
                       bool prefix_caching) {
  SimOptions o;
  o.scheduler = DefaultSchedulerConfig(cost.params());
  o.scheduler.enable_prefix_caching = prefix_caching;
  o.controller = ControllerFor(mode, cap);
  o.controller.slo.ttft_target_s = ttft_s;
  o.controller.slo.tpot_target_s = tpot_s;
  o.lanes = LanesWithSlo(ttft_s, tpot_s);
  return o;
}

int64_t Good(const SimResult& run, double ttft_s, double tpot_s) {
  return Summarize(run, LanesWithSlo(ttft_s, tpot_s)).all().num_good;
}

// One trace under one preset and caching setting: one outcome per SLO. A
// static cap and load-level do not read the SLO, so one run of each serves
// every SLO; slo runs once per SLO.
std::vector<TraceOutcome> MeasureTrace(const CostModel& cost, const std::vector<TraceRequest>& trace,
                                       uint64_t seed, bool prefix_caching, const HeldOutOptions& o) {
  const int32_t max_seqs = EvalMaxNumSeqs(cost.params());
  std::vector<TraceOutcome> out(o.tpot_slos_s.size());
  for (size_t i = 0; i < out.size(); ++i) out[i].seed = seed;
  auto each_slo = [&](const SimResult& run, auto record) {
    for (size_t i = 0; i < out.size(); ++i) record(out[i], Good(run, o.ttft_slo_s, o.tpot_slos_s[i]));
  };
  for (int32_t cap : o.static_caps) {
    if (cap > max_seqs) continue;
    const SimResult run = RunSimulation(
        trace, cost, CellOptions(cost, ControllerMode::kStatic, cap, o.ttft_slo_s, 0.05, prefix_caching));
    each_slo(run, [&](TraceOutcome& t, int64_t good) {
      t.static_good[cap] = good;
      if (good > t.best_static_good) t.best_static_good = good, t.best_cap = cap;
    });
  }
  const SimResult level = RunSimulation(
      trace, cost, CellOptions(cost, ControllerMode::kLoadLevel, max_seqs, o.ttft_slo_s, 0.05, prefix_caching));
  each_slo(level, [](TraceOutcome& t, int64_t good) { t.load_level_good = good; });
  for (size_t i = 0; i < out.size(); ++i) {
    const double tpot = o.tpot_slos_s[i];
    const SimOptions so = CellOptions(cost, ControllerMode::kSlo, max_seqs, o.ttft_slo_s, tpot, prefix_caching);
    out[i].slo_good = Good(RunSimulation(trace, cost, so), o.ttft_slo_s, tpot);
  }
  return out;
}

// The cap within 95% on the most traces, and which traces it misses.
void MarkHardTraces(HeldOutCell& cell) {
  std::map<int32_t, int> within;
  for (const TraceOutcome& t : cell.traces) {
    for (const auto& [cap, good] : t.static_good) within[cap] += good >= 0.95 * t.best_static_good;
  }
  int most = -1;
  for (const auto& [cap, n] : within) {
    if (n > most) most = n, cell.one_cap = cap;  // map order: ties keep the smaller cap
  }
  for (const TraceOutcome& t : cell.traces) {
    cell.is_hard.push_back(t.static_good.at(cell.one_cap) < 0.95 * t.best_static_good);
  }
}

double Percentile(const std::vector<double>& sorted, double pct) {
  const double rank = std::ceil(pct / 100.0 * static_cast<double>(sorted.size()));
  return sorted[static_cast<size_t>(std::clamp(rank, 1.0, static_cast<double>(sorted.size()))) - 1];
}

}  // namespace

std::vector<uint64_t> HeldOutSeeds() {
  std::vector<uint64_t> seeds;
  for (uint64_t s = kHeldOutSeedBegin; s < kHeldOutSeedBegin + kHeldOutNumSeeds; ++s) seeds.push_back(s);
  return seeds;
}

int32_t EvalMaxNumSeqs(const CostModelParams& preset) {
  const int64_t pool = preset.kv_capacity_tokens > 0 ? preset.kv_capacity_tokens : int64_t{1} << 20;
  return static_cast<int32_t>(std::clamp<int64_t>(pool / 640, 1, 256));
}

std::vector<HeldOutCell> RunHeldOut(const HeldOutOptions& o) {
  std::vector<HeldOutCell> cells;
  for (const std::string& preset : o.presets) {
    const CostModel cost(LoadPreset(preset));
    for (bool caching : o.prefix_caching) {
      const size_t first = cells.size();
      for (double slo : o.tpot_slos_s) {
        HeldOutCell cell;
        cell.preset = preset;
        cell.tpot_slo_s = slo;
        cell.prefix_caching = caching;
        cells.push_back(std::move(cell));
      }
      for (uint64_t seed : o.seeds) {
        const FamilyMember m = DrawFamilyMember(seed, cost.params());
        const std::vector<TraceRequest> trace = GenerateFamilyTrace(m);
        std::vector<TraceOutcome> per_slo = MeasureTrace(cost, trace, seed, caching, o);
        for (size_t i = 0; i < per_slo.size(); ++i) {
          HeldOutCell& cell = cells[first + i];
          if (per_slo[i].best_static_good > 0) {
            cell.traces.push_back(std::move(per_slo[i]));
          } else {
            ++cell.num_no_goodput;
          }
        }
        if (o.progress) {
          o.progress(preset + (caching ? ", prefix caching" : ", no prefix caching") + ": " +
                     DescribeMember(m) + ", " + std::to_string(trace.size()) + " requests");
        }
      }
      for (size_t i = first; i < cells.size(); ++i) MarkHardTraces(cells[i]);
    }
  }
  return cells;
}

RatioStats ComputeRatioStats(std::vector<double> ratios) {
  RatioStats s;
  s.count = ratios.size();
  if (ratios.empty()) return s;
  std::sort(ratios.begin(), ratios.end());
  s.min = ratios.front();
  s.p5 = Percentile(ratios, 5);
  s.median = Percentile(ratios, 50);
  for (double r : ratios) {
    s.num_below_95 += r < 0.95;
    s.num_below_90 += r < 0.90;
  }
  return s;
}

namespace {

std::string Stats(const RatioStats& s) {
  if (s.count == 0) return "- | - | - | -";
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%.3f | %.3f | %.3f | %zu/%zu", s.min, s.p5, s.median, s.count - s.num_below_95,
                s.count);
  return buf;
}

// Ratios of one mode over the traces of `cells` (only the hard ones if asked).
std::vector<double> Ratios(const std::vector<const HeldOutCell*>& cells, bool is_slo, bool hard_only) {
  std::vector<double> out;
  for (const HeldOutCell* c : cells) {
    for (size_t i = 0; i < c->traces.size(); ++i) {
      if (hard_only && !c->is_hard[i]) continue;
      const TraceOutcome& t = c->traces[i];
      out.push_back(t.ratio(is_slo ? t.slo_good : t.load_level_good));
    }
  }
  return out;
}

std::string Row(const std::string& label, const std::vector<const HeldOutCell*>& cells, const std::string& one_cap) {
  size_t traces = 0, hard = 0, none = 0;
  for (const HeldOutCell* c : cells) {
    traces += c->traces.size();
    hard += static_cast<size_t>(std::count(c->is_hard.begin(), c->is_hard.end(), true));
    none += static_cast<size_t>(c->num_no_goodput);
  }
  char buf[128];
  std::snprintf(buf, sizeof(buf), "| %s | %zu (%zu) | %s | %zu | ", label.c_str(), traces, none, one_cap.c_str(), hard);
  return buf + Stats(ComputeRatioStats(Ratios(cells, true, false))) + " | " +
         Stats(ComputeRatioStats(Ratios(cells, false, false))) + " | " +
         Stats(ComputeRatioStats(Ratios(cells, true, true))) + " | " +
         Stats(ComputeRatioStats(Ratios(cells, false, true))) + " |\n";
}

}  // namespace

std::string FormatHeldOut(const std::vector<HeldOutCell>& cells) {
  std::string out =
      "| cell | traces (no goodput) | one static cap | hard | slo min | p5 | median | >= 0.95 "
      "| load-level min | p5 | median | >= 0.95 | slo on hard: min | p5 | median | >= 0.95 "
      "| load-level on hard: min | p5 | median | >= 0.95 |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  std::vector<const HeldOutCell*> all;
  for (const HeldOutCell& c : cells) {
    char label[128];
    std::snprintf(label, sizeof(label), "%s, %s, TPOT %.1f ms", c.preset.c_str(),
                  c.prefix_caching ? "caching" : "no caching", 1e3 * c.tpot_slo_s);
    out += Row(label, {&c}, std::to_string(c.one_cap));
    all.push_back(&c);
  }
  out += Row("**all**", all, "-");
  return out;
}

}  // namespace ferry::sim
