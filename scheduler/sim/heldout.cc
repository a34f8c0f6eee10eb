#include "scheduler/sim/heldout.h"

#include <algorithm>
#include <cmath>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "scheduler/sim/report.h"
#include "scheduler/sim/scenarios.h"
#include "scheduler/sim/trace_family.h"

namespace ferry::sim {
namespace {

using scheduler::ControllerMode;

static_assert(kTuningSeedEnd <= kHeldOutSeedBegin, "the tuning and held-out seed ranges overlap");

// The evaluation for one preset: HeldOutOptions with its time scale k
// applied to every SLO (the batch lane's in Lanes). `scale` is k.
struct PresetEval {
  HeldOutOptions o;
  double scale = 1;
};

PresetEval ForPreset(const HeldOutOptions& o, const std::string& preset) {
  PresetEval e{o, TimeScale(o, preset)};
  e.o.ttft_slo_s *= e.scale;
  for (double& t : e.o.tpot_slos_s) t *= e.scale;
  return e;
}

// The lanes at a cell's (scaled) SLO; the batch lane keeps its own, scaled too.
std::vector<LaneConfig> Lanes(double ttft_s, double tpot_s, double scale) {
  std::vector<LaneConfig> lanes = LanesWithSlo(ttft_s, tpot_s);
  for (LaneConfig& l : lanes) {
    if (l.name == "batch") l.ttft_slo_s *= scale, l.tpot_slo_s *= scale;
  }
  return lanes;
}

// How a cell runs: the sim's default scheduler config with the cell's
// prefix caching and queue order; the controller's targets are the cell's SLO.
SimOptions CellOptions(const CostModel& cost, ControllerMode mode, int32_t cap, double tpot_s, bool prefix_caching,
                       const PresetEval& eval) {
  const double ttft_s = eval.o.ttft_slo_s;
  SimOptions o;
  o.scheduler = DefaultSchedulerConfig(cost.params());
  o.scheduler.enable_prefix_caching = prefix_caching;
  o.scheduler.serve_late_last = eval.o.serve_late_last;
  o.controller = ControllerFor(mode, cap);
  o.controller.slo.ttft_target_s = ttft_s;
  o.controller.slo.tpot_target_s = tpot_s;
  o.controller.goodput.reach_share = eval.o.reach_share;
  o.lanes = Lanes(ttft_s, tpot_s, eval.scale);
  return o;
}

int64_t Good(const SimResult& run, const PresetEval& eval, double tpot_s) {
  return Summarize(run, Lanes(eval.o.ttft_slo_s, tpot_s, eval.scale)).all().num_good;
}

// Static goodput kept between runs (HeldOutOptions::static_cache_path),
// keyed by preset, caching, seed, cap, the two SLOs and the queue order.
using StaticCache = std::map<std::string, int64_t>;

std::string CacheKey(const std::string& preset, bool caching, uint64_t seed, int32_t cap, double ttft_s,
                     double tpot_s, bool late_last) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%s %d %llu %d %.6g %.6g %s", preset.c_str(), caching ? 1 : 0,
                static_cast<unsigned long long>(seed), cap, ttft_s, tpot_s, late_last ? "late-last" : "fcfs");
  return buf;
}

StaticCache ReadCache(const std::string& path) {
  StaticCache cache;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t last = line.rfind(' ');
    if (last == std::string::npos) continue;
    cache[line.substr(0, last)] = std::stoll(line.substr(last + 1));
  }
  return cache;
}

void WriteCache(const std::string& path, const StaticCache& cache) {
  std::ofstream out(path);
  for (const auto& [key, good] : cache) out << key << ' ' << good << '\n';
}

// One trace under one preset and caching setting: one outcome per SLO. A
// static cap does not read the SLO, so one run serves every SLO; the
// adaptive modes run once per SLO. Static goodput found in `cache` is not
// remeasured; what is measured goes to `measured`.
std::vector<TraceOutcome> MeasureTrace(const CostModel& cost, const std::vector<TraceRequest>& trace,
                                       uint64_t seed, bool prefix_caching, const PresetEval& eval,
                                       const StaticCache& cache, StaticCache& measured) {
  const HeldOutOptions& o = eval.o;
  const int32_t max_seqs = EvalMaxNumSeqs(cost.params());
  const std::string& preset = cost.params().name;
  std::vector<TraceOutcome> out(o.tpot_slos_s.size());
  for (size_t i = 0; i < out.size(); ++i) out[i].seed = seed;
  auto each_slo = [&](const SimResult& run, auto record) {
    for (size_t i = 0; i < out.size(); ++i) record(out[i], Good(run, eval, o.tpot_slos_s[i]));
  };
  for (int32_t cap : o.static_caps) {
    if (cap > max_seqs) continue;
    std::vector<std::string> keys;
    std::vector<int64_t> goods;
    for (double tpot : o.tpot_slos_s) {
      keys.push_back(CacheKey(preset, prefix_caching, seed, cap, o.ttft_slo_s, tpot, o.serve_late_last));
      const auto it = cache.find(keys.back());
      if (it != cache.end()) goods.push_back(it->second);
    }
    if (goods.size() != keys.size()) {
      goods.clear();
      const SimResult run = RunSimulation(
          trace, cost, CellOptions(cost, ControllerMode::kStatic, cap, 0.05, prefix_caching, eval));
      each_slo(run, [&](TraceOutcome&, int64_t good) { goods.push_back(good); });
    }
    for (size_t i = 0; i < out.size(); ++i) {
      measured[keys[i]] = goods[i];
      TraceOutcome& t = out[i];
      t.static_good[cap] = goods[i];
      if (goods[i] > t.best_static_good) t.best_static_good = goods[i], t.best_cap = cap;
    }
  }
  for (size_t i = 0; i < out.size(); ++i) {
    const double tpot = o.tpot_slos_s[i];
    if (!o.only_goodput) {
      const SimOptions lo = CellOptions(cost, ControllerMode::kLoadLevel, max_seqs, tpot, prefix_caching, eval);
      out[i].load_level_good = Good(RunSimulation(trace, cost, lo), eval, tpot);
    }
    const SimOptions go = CellOptions(cost, ControllerMode::kGoodput, max_seqs, tpot, prefix_caching, eval);
    out[i].goodput_good = Good(RunSimulation(trace, cost, go), eval, tpot);
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

CostModelParams Faster(CostModelParams p, double k) {
  p.fixed_s /= k, p.batched_step_s /= k, p.per_seq_s /= k, p.per_context_token_s /= k;
  p.bandwidth_bytes_per_s *= k, p.peak_flops *= k;
  return p;
}

double TimeScale(const HeldOutOptions& o, const std::string& preset) {
  const auto it = o.time_scale.find(preset);
  return it != o.time_scale.end() ? it->second : 1.0;
}

FamilyMember EvalMember(uint64_t seed, const CostModelParams& preset, double k) {
  return DrawFamilyMember(seed, Faster(preset, k));
}

std::vector<TraceRequest> EvalTrace(const FamilyMember& member, double k) {
  std::vector<TraceRequest> trace = GenerateFamilyTrace(member);
  for (TraceRequest& r : trace) r.arrival_s *= k;
  return trace;
}

std::vector<uint64_t> HeldOutSeeds() {
  std::vector<uint64_t> seeds;
  for (uint64_t s = kHeldOutSeedBegin; s < kHeldOutSeedBegin + kHeldOutNumSeeds; ++s) seeds.push_back(s);
  return seeds;
}

int32_t EvalMaxNumSeqs(const CostModelParams& preset) {
  const int64_t pool = preset.kv_capacity_tokens > 0 ? preset.kv_capacity_tokens : int64_t{1} << 20;
  return static_cast<int32_t>(std::clamp<int64_t>(pool / 640, 1, 256));
}

std::vector<uint64_t> TuningSeeds(uint64_t count) {
  std::vector<uint64_t> seeds;
  for (uint64_t s = kTuningSeedBegin; s < kTuningSeedBegin + count && s <= kTuningSeedEnd; ++s) seeds.push_back(s);
  return seeds;
}

// The window's arrivals played twice: the same requests again, one window later.
std::vector<TraceRequest> ArrivalsTwice(const std::vector<TraceRequest>& trace, double window_s) {
  std::vector<TraceRequest> out = trace;
  for (const TraceRequest& r : trace) {
    out.push_back(r);
    out.back().arrival_s += window_s;
  }
  return out;
}

// HeldOutOptions::twice_below for one trace's outcomes (one per SLO).
void CheckArrivalsTwice(const CostModel& cost, const std::vector<TraceRequest>& trace, bool prefix_caching,
                        const PresetEval& eval, std::vector<TraceOutcome>& out) {
  const HeldOutOptions& o = eval.o;
  std::vector<size_t> weak;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].best_static_good > 0 && out[i].ratio(out[i].goodput_good) < o.twice_below) weak.push_back(i);
  }
  if (weak.empty()) return;
  const std::vector<TraceRequest> twice = ArrivalsTwice(trace, kFamilyDurationS * eval.scale);
  const int32_t max_seqs = EvalMaxNumSeqs(cost.params());
  std::vector<std::map<int32_t, int64_t>> good(weak.size());
  for (int32_t cap : o.static_caps) {
    if (cap > max_seqs) continue;
    const SimResult run =
        RunSimulation(twice, cost, CellOptions(cost, ControllerMode::kStatic, cap, 0.05, prefix_caching, eval));
    for (size_t w = 0; w < weak.size(); ++w) good[w][cap] = Good(run, eval, o.tpot_slos_s[weak[w]]);
  }
  for (size_t w = 0; w < weak.size(); ++w) {
    TraceOutcome& t = out[weak[w]];
    const double tpot = o.tpot_slos_s[weak[w]];
    int64_t best = 0;
    for (const auto& [cap, g] : good[w]) {
      if (g > best) best = g, t.twice_best_cap = cap;
    }
    if (best <= 0) continue;
    const SimOptions go = CellOptions(cost, ControllerMode::kGoodput, max_seqs, tpot, prefix_caching, eval);
    t.twice_goodput_ratio = static_cast<double>(Good(RunSimulation(twice, cost, go), eval, tpot)) / best;
    t.twice_best_cap_ratio = static_cast<double>(good[w][t.best_cap]) / best;
  }
}

std::vector<HeldOutCell> RunHeldOut(const HeldOutOptions& o) {
  const StaticCache cache = o.static_cache_path.empty() ? StaticCache{} : ReadCache(o.static_cache_path);
  StaticCache measured;
  std::vector<HeldOutCell> cells;
  for (const std::string& preset : o.presets) {
    const CostModel cost(LoadPreset(preset));
    const PresetEval eval = ForPreset(o, preset);
    for (bool caching : o.prefix_caching) {
      const size_t first = cells.size();
      for (double slo : eval.o.tpot_slos_s) {
        HeldOutCell cell;
        cell.preset = preset;
        cell.tpot_slo_s = slo;
        cell.prefix_caching = caching;
        cells.push_back(std::move(cell));
      }
      // Each trace on its own thread's turn; results land by index, so the
      // report does not depend on the order they finish in.
      std::vector<std::vector<TraceOutcome>> per_seed(o.seeds.size());
      std::vector<StaticCache> measured_per_seed(o.seeds.size());
      std::atomic<size_t> next{0};
      std::mutex progress_mu;
      auto work = [&] {
        for (size_t k; (k = next.fetch_add(1)) < o.seeds.size();) {
          const FamilyMember m = EvalMember(o.seeds[k], cost.params(), eval.scale);
          const std::vector<TraceRequest> trace = EvalTrace(m, eval.scale);
          per_seed[k] = MeasureTrace(cost, trace, o.seeds[k], caching, eval, cache, measured_per_seed[k]);
          if (o.twice_below > 0) CheckArrivalsTwice(cost, trace, caching, eval, per_seed[k]);
          if (o.progress) {
            std::lock_guard<std::mutex> lock(progress_mu);
            o.progress(preset + (caching ? ", prefix caching" : ", no prefix caching") + ": seed " +
                       std::to_string(o.seeds[k]) + ", " + DescribeMember(m) + ", " +
                       std::to_string(trace.size()) + " requests");
          }
        }
      };
      std::vector<std::thread> threads;
      for (int32_t j = 1; j < std::max(1, o.jobs); ++j) threads.emplace_back(work);
      work();
      for (std::thread& t : threads) t.join();
      for (size_t k = 0; k < o.seeds.size(); ++k) {
        measured.insert(measured_per_seed[k].begin(), measured_per_seed[k].end());
        for (size_t i = 0; i < per_seed[k].size(); ++i) {
          HeldOutCell& cell = cells[first + i];
          if (per_seed[k][i].best_static_good > 0) {
            cell.traces.push_back(std::move(per_seed[k][i]));
          } else {
            ++cell.num_no_goodput;
          }
        }
      }
      for (size_t i = first; i < cells.size(); ++i) MarkHardTraces(cells[i]);
    }
  }
  if (!o.static_cache_path.empty()) {
    StaticCache all = cache;
    for (const auto& [key, good] : measured) all[key] = good;
    WriteCache(o.static_cache_path, all);
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
enum class Mode { kLoadLevel, kGoodput };

int64_t GoodOf(const TraceOutcome& t, Mode mode) {
  switch (mode) {
    case Mode::kLoadLevel: return t.load_level_good;
    case Mode::kGoodput: return t.goodput_good;
  }
  return 0;
}

std::vector<double> Ratios(const std::vector<const HeldOutCell*>& cells, Mode mode, bool hard_only) {
  std::vector<double> out;
  for (const HeldOutCell* c : cells) {
    for (size_t i = 0; i < c->traces.size(); ++i) {
      if (hard_only && !c->is_hard[i]) continue;
      const TraceOutcome& t = c->traces[i];
      out.push_back(t.ratio(GoodOf(t, mode)));
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
  std::string row = buf;
  for (bool hard_only : {false, true}) {
    for (Mode mode : {Mode::kGoodput, Mode::kLoadLevel}) {
      row += Stats(ComputeRatioStats(Ratios(cells, mode, hard_only))) + " | ";
    }
  }
  row.pop_back();
  return row + "\n";
}

}  // namespace

std::string FormatHeldOut(const std::vector<HeldOutCell>& cells) {
  std::string out =
      "| cell | traces (no goodput) | one static cap | hard | goodput min | p5 | median | >= 0.95 "
      "| load-level min | p5 | median | >= 0.95 "
      "| goodput on hard: min | p5 | median | >= 0.95 "
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

std::string FormatWeakTraces(const std::vector<HeldOutCell>& cells, double below) {
  std::string out;
  size_t under_90 = 0, twice_run = 0, twice_at_90 = 0;
  for (const HeldOutCell& c : cells) {
    for (size_t i = 0; i < c.traces.size(); ++i) {
      const TraceOutcome& t = c.traces[i];
      if (t.ratio(t.goodput_good) < 0.90) {
        ++under_90;
        twice_run += t.twice_goodput_ratio >= 0;
        twice_at_90 += t.twice_goodput_ratio >= 0.90;
      }
      // only_goodput leaves load-level at 0: a mode that did not run is not weak.
      const bool weak = t.ratio(t.goodput_good) < below ||
                        (t.load_level_good > 0 && t.ratio(t.load_level_good) < below);
      if (!weak) continue;
      char buf[480];
      int n = std::snprintf(buf, sizeof(buf),
                            "seed %llu %s %s TPOT %.1f ms%s: best cap %d (%lld good), one cap %d %.3f, goodput %.3f, "
                            "load-level %.3f",
                            static_cast<unsigned long long>(t.seed), c.preset.c_str(),
                            c.prefix_caching ? "caching" : "no-caching", 1e3 * c.tpot_slo_s, c.is_hard[i] ? " hard" : "",
                            t.best_cap, static_cast<long long>(t.best_static_good), c.one_cap,
                            t.ratio(t.static_good.at(c.one_cap)), t.ratio(t.goodput_good), t.ratio(t.load_level_good));
      if (t.twice_goodput_ratio >= 0 && n > 0 && static_cast<size_t>(n) < sizeof(buf)) {
        std::snprintf(buf + n, sizeof(buf) - static_cast<size_t>(n),
                      "; arrivals twice: goodput %.3f of the best cap there (%d), cap %d %.3f",
                      t.twice_goodput_ratio, t.twice_best_cap, t.best_cap, t.twice_best_cap_ratio);
      }
      out += std::string(buf) + "\n";
    }
  }
  char buf[240];
  std::snprintf(buf, sizeof(buf), "goodput under 0.90: %zu trace-cells; arrivals twice run on %zu, goodput at 0.90 "
                "or more there on %zu\n", under_90, twice_run, twice_at_90);
  return out + buf;
}

}  // namespace ferry::sim
