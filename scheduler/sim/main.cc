// ferry-sim: runs the scheduler core and the max_num_seqs controller in
// virtual time over a generated or replayed workload. See
// docs/benchmarks/scheduler.md for the commands behind the published tables.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "scheduler/core/replica_flags.h"
#include "scheduler/core/scheduler_core.h"
#include "scheduler/sim/heldout.h"
#include "scheduler/sim/report.h"
#include "scheduler/sim/scenarios.h"
#include "scheduler/sim/trace_family.h"

namespace {

using namespace ferry::sim;
using ferry::scheduler::ControllerMode;

// The replica's flags are ferry-scheduler's (scheduler/core/replica_flags.h): one name, default and help.
struct Flags : ferry::scheduler::ReplicaFlags {
  std::string preset = "rtx4090d-tp4";
  std::string trace, write_trace, json_path, results_path, scenario = "steady", arrival, spike_lane = "-";
  double rate_per_s = 0, duration_s = 0, burst_cv = 0, spike_multiplier = 3.0;
  uint64_t seed = 0;
  uint64_t family_seed = 0;
  bool has_family_seed = false, heldout = false;
  double reach_share = ferry::scheduler::GoodputOptions{}.reach_share;
  uint64_t heldout_num_seeds = kHeldOutNumSeeds;
  uint64_t tuning_num_seeds = 0;  // --tuning N: the evaluation on tuning seeds instead
  int32_t jobs = 1;
  std::string static_cache;
  double list_below = 0, twice_below = 0;
  bool only_goodput = false;
  int32_t initial_num_seqs = 0, num_kv_blocks = 0;
  bool sweep = false, compare = false;
  std::vector<int32_t> caps = {1, 4, 8, 16, 32, 64};
  double timeout_s = 0.5;
  // A family member of a dilated preset (HeldOutOptions::time_scale) is
  // played as the held-out evaluation plays it: its batch lane's SLOs
  // dilated too, so --slo-ttft-ms and --slo-tpot-ms alone replay one cell.
  double batch_lane_scale = 1;
  // One pair of targets says what the adaptive modes aim at and what counts
  // as good; --lane-ttft-ms replaces a lane's TTFT SLO.
  std::vector<LaneConfig> lanes() const {
    std::vector<LaneConfig> out = LanesWithSlo(slo_ttft_ms / 1000.0, slo_tpot_ms / 1000.0);
    for (LaneConfig& l : out) {
      if (l.name == "batch") l.ttft_slo_s *= batch_lane_scale, l.tpot_slo_s *= batch_lane_scale;
    }
    for (const std::string& spec : lane_ttft) {
      const ferry::scheduler::LaneTtft t = ferry::scheduler::ParseLaneTtft(spec);
      LaneConfig* lane = nullptr;
      for (LaneConfig& l : out) {
        if (l.name == t.lane) lane = &l;
      }
      if (lane == nullptr) {
        throw std::invalid_argument("--lane-ttft-ms " + spec + ": want LANE=MS, LANE one of interactive, batch, default");
      }
      lane->ttft_slo_s = t.ttft_ms / 1000.0;
    }
    return out;
  }
};

double WallSeconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::vector<TraceRequest> LoadWorkload(const Flags& f, const ferry::CostModel& cost) {
  if (!f.trace.empty()) return ReadTrace(f.trace);
  if (f.has_family_seed) {
    // As the held-out evaluation plays it: a slow preset's member dilated (HeldOutOptions::time_scale).
    const double k = TimeScale(HeldOutOptions{}, cost.params().name);
    const FamilyMember m = EvalMember(f.family_seed, cost.params(), k);
    std::printf("trace family member (preset %s, time scale %g): %s\n", cost.params().name.c_str(), k,
                DescribeMember(m).c_str());
    return EvalTrace(m, k);
  }
  WorkloadOptions w = ScenarioWorkload(f.scenario, f.spike_multiplier);
  if (!f.arrival.empty()) w.arrivals.kind = ParseArrivalKind(f.arrival);
  if (f.rate_per_s > 0) w.arrivals.rate_per_s = f.rate_per_s;
  if (f.duration_s > 0) w.arrivals.duration_s = f.duration_s;
  if (f.burst_cv > 0) w.arrivals.burst_cv = f.burst_cv;
  if (f.spike_lane != "-") w.arrivals.spike_lane = f.spike_lane;
  if (f.seed > 0) w.seed = f.seed;
  return GenerateWorkload(w);
}

SimOptions MakeSimOptions(const Flags& f, const ferry::CostModel& cost, ControllerMode mode, int32_t cap) {
  SimOptions sim;
  sim.scheduler = DefaultSchedulerConfig(cost.params());  // the engine's: KV pool and block size
  ferry::scheduler::ApplyTo(f, sim.scheduler);
  if (f.num_kv_blocks > 0) sim.scheduler.num_kv_blocks = f.num_kv_blocks;
  // --compare runs several modes and caps from one command line.
  sim.controller = ferry::scheduler::ControllerOptionsFrom(f, ControllerFor(mode, cap));
  sim.controller.mode = mode;
  sim.controller.max_num_seqs = cap;
  sim.controller.min_num_seqs = std::min(f.min_num_seqs, cap);
  sim.controller.initial_num_seqs = f.initial_num_seqs;
  sim.controller.goodput.reach_share = f.reach_share;
  sim.lanes = f.lanes();
  return sim;
}

int RunSweepMode(const Flags& f, const ferry::CostModel& cost) {
  SweepOptions o;
  o.caps = f.caps;
  o.timeout_s = f.timeout_s;
  const auto start = std::chrono::steady_clock::now();
  std::vector<SweepRow> rows = RunSweep(cost, o);
  const double wall = WallSeconds(start);
  double sim_s = 0;
  for (const SweepRow& r : rows) sim_s += r.sim_s;
  std::printf("preset %s; closed loop of max_num_seqs clients, input ~512 (32..2048), output 128; "
              "success = e2e <= %.3f s\n%s", cost.params().name.c_str(), f.timeout_s,
              FormatSweep(rows).c_str());
  std::printf("simulated %.1f s in %.2f s wall: %.0fx real time\n", sim_s, wall, sim_s / wall);
  return 0;
}

int RunCompareMode(const Flags& f, const ferry::CostModel& cost, const std::vector<TraceRequest>& trace) {
  std::printf("| controller | goodput req | goodput %% | interactive good %% | batch good %% | "
              "int. TTFT p99 ms | tok/s | preemptions | cap changes |\n|---|---|---|---|---|---|---|---|---|\n");
  auto row = [&](const std::string& name, ControllerMode mode, int32_t cap) {
    SimResult r = RunSimulation(trace, cost, MakeSimOptions(f, cost, mode, cap));
    SimReport rep = Summarize(r, f.lanes());
    auto lane = [&](const char* n) {
      for (const LaneReport& l : rep.lanes) if (l.lane == n) return l;
      return LaneReport{};
    };
    auto pct = [](const LaneReport& l) { return l.num_requests ? 100.0 * l.num_good / l.num_requests : 0.0; };
    std::printf("| %s | %lld | %.1f | %.1f | %.1f | %.0f | %.0f | %llu | %zu |\n", name.c_str(),
                static_cast<long long>(rep.all().num_good), 100 * rep.goodput_fraction(),
                pct(lane("interactive")), pct(lane("batch")), 1e3 * lane("interactive").ttft_s.p99,
                rep.output_tokens_per_s, static_cast<unsigned long long>(rep.num_preemptions),
                rep.num_cap_changes);
  };
  for (int32_t cap : f.caps) row("static " + std::to_string(cap), ControllerMode::kStatic, cap);
  row("load-level", ControllerMode::kLoadLevel, f.max_num_seqs);
  row("goodput", ControllerMode::kGoodput, f.max_num_seqs);
  return 0;
}

// Checks across flags CLI11 cannot express; prints what is wrong.
bool FlagsAreValid(const Flags& f) {
  if (f.has_family_seed && !f.trace.empty()) {
    std::fprintf(stderr, "ferry-sim: --family-seed %llu and --trace %s both name a workload; give one\n",
                 static_cast<unsigned long long>(f.family_seed), f.trace.c_str());
    return false;
  }
  try {
    f.lanes();
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "ferry-sim: %s\n", e.what());
    return false;
  }
  if (!f.lane_ttft.empty() && (f.heldout || f.tuning_num_seeds > 0)) {
    std::fprintf(stderr, "ferry-sim: --lane-ttft-ms is for one run; --heldout and --tuning keep the lanes' SLOs\n");
    return false;
  }
  if (f.heldout_num_seeds < 1 || f.heldout_num_seeds > kHeldOutNumSeeds) {
    std::fprintf(stderr, "ferry-sim: --heldout-num-seeds %llu is outside 1..%llu (the held-out range)\n",
                 static_cast<unsigned long long>(f.heldout_num_seeds),
                 static_cast<unsigned long long>(kHeldOutNumSeeds));
    return false;
  }
  return true;
}

// The held-out evaluation (docs/benchmarks/scheduler.md, "Held-out traces").
int RunHeldOutMode(const Flags& f, const CLI::App& app) {
  HeldOutOptions o;
  o.seeds.resize(static_cast<size_t>(f.heldout_num_seeds));
  if (f.tuning_num_seeds > 0) o.seeds = TuningSeeds(f.tuning_num_seeds);
  o.jobs = f.jobs;
  o.static_cache_path = f.static_cache;
  o.only_goodput = f.only_goodput;
  o.twice_below = f.twice_below;
  if (app.count("--caps") > 0) o.static_caps = f.caps;
  // A cell flag given explicitly keeps only its cells (a quicker look at one
  // kind of trace-cell while tuning).
  if (app.count("--preset") > 0) o.presets = {f.preset};
  o.reach_share = f.reach_share;
  if (app.count("--enable-prefix-caching") + app.count("--no-enable-prefix-caching") > 0) {
    o.prefix_caching = {f.enable_prefix_caching};
  }
  if (app.count("--slo-tpot-ms") > 0) o.tpot_slos_s = {f.slo_tpot_ms / 1000.0};
  o.ttft_slo_s = f.slo_ttft_ms / 1000.0;
  o.serve_late_last = f.serve_late_last;
  o.progress = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  std::printf("%s seeds %llu..%llu, TTFT SLO %.0f ms, %s, static caps", f.tuning_num_seeds > 0 ? "tuning" : "held-out",
              static_cast<unsigned long long>(o.seeds.front()), static_cast<unsigned long long>(o.seeds.back()),
              f.slo_ttft_ms, f.serve_late_last ? "late requests last" : "first come, first served");
  for (int32_t cap : o.static_caps) std::printf(" %d", cap);
  std::printf(" (up to each preset's bound: rtx4090d-tp4 %d, h200 %d)\n", EvalMaxNumSeqs(LoadPreset("rtx4090d-tp4")),
              EvalMaxNumSeqs(LoadPreset("h200")));
  const auto start = std::chrono::steady_clock::now();
  const std::vector<HeldOutCell> cells = RunHeldOut(o);
  std::printf("%s", FormatHeldOut(cells).c_str());
  if (f.list_below > 0) std::printf("%s", FormatWeakTraces(cells, f.list_below).c_str());
  std::printf("wall time %.0f s\n", WallSeconds(start));
  return 0;
}

int RunOnce(const Flags& f, const ferry::CostModel& cost, const std::vector<TraceRequest>& trace) {
  const ControllerMode mode = ferry::scheduler::ParseControllerMode(f.controller_mode);
  const auto start = std::chrono::steady_clock::now();
  SimResult result = RunSimulation(trace, cost, MakeSimOptions(f, cost, mode, f.max_num_seqs));
  const double wall = WallSeconds(start);
  SimReport rep = Summarize(result, f.lanes());
  std::printf("preset %s, mode %s, max_num_seqs %d, %zu requests\n%s", cost.params().name.c_str(),
              f.controller_mode.c_str(), f.max_num_seqs, trace.size(), FormatReport(rep).c_str());
  std::printf("cap changes:\n%s", FormatCapChanges(result, 40).c_str());
  std::printf("simulated %.1f s in %.3f s wall: %.0fx real time\n", result.sim_s, wall, result.sim_s / wall);
  if (!f.json_path.empty()) std::ofstream(f.json_path) << ReportToJson(rep, result).dump(2) << '\n';
  if (!f.results_path.empty()) WriteResults(f.results_path, result, f.lanes());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ferry-sim: the Ferry scheduler and max_num_seqs controller in virtual time"};
  Flags f;
  app.add_option("--preset", f.preset,
                 "cost model: rtx4090d-tp4, h200, cpu-0.5b (the CPU engine, scheduler/sim/presets), or a JSON path");
  app.add_option("--trace", f.trace, "replay a JSONL trace instead of generating");
  app.add_option("--write-trace", f.write_trace, "write the workload as a JSONL trace");
  app.add_option("--scenario", f.scenario, "steady, bursty, diurnal, spike, long-context, chat");
  app.add_option("--arrival", f.arrival, "override the arrival process: poisson, bursty, diurnal, spike, on-off");
  app.add_option("--request-rate", f.rate_per_s, "mean arrival rate, requests/s (ferry-bench's name)");
  app.add_option("--duration-s", f.duration_s, "length of the arrival window");
  app.add_option("--burst-cv", f.burst_cv, "bursty: coefficient of variation of the gaps");
  app.add_option("--spike-multiplier", f.spike_multiplier, "spike: rate multiplier during the spike");
  app.add_option("--spike-lane", f.spike_lane,
                 "spike: lane that takes the excess (\"\": scale every lane; default: the scenario's)");
  app.add_option("--seed", f.seed, "workload seed (0: the scenario's)");
  app.add_option("--family-seed", f.family_seed,
                 "use member N of the trace family (issue #30) for --preset instead of a scenario, played as the "
                 "held-out evaluation plays it (cpu-0.5b dilated x20, its batch lane's SLOs too: 600 s, 4 s)");
  app.add_flag("--heldout", f.heldout,
               "the held-out evaluation: goodput, slo, load-level and static caps on the held-out family members");
  app.add_option("--heldout-num-seeds", f.heldout_num_seeds, "--heldout: the first N held-out seeds");
  app.add_option("--tuning", f.tuning_num_seeds,
                 "the held-out evaluation's cells and report on the first N tuning seeds (what to tune on); "
                 "--preset, --[no-]enable-prefix-caching and --slo-tpot-ms, when given, keep only their cells");
  app.add_option("--jobs", f.jobs, "--heldout/--tuning: traces measured at once")->check(CLI::Range(1, 256));
  app.add_option("--static-cache", f.static_cache,
                 "--heldout/--tuning: keep static caps' goodput in this file between runs");
  app.add_option("--reach-share", f.reach_share,
                 "adaptive modes: the share of the SLO lanes' work some cap must serve within the targets for the "
                 "planner to plan for goodput; below it, the most completions (0: always goodput)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_flag("--only-goodput", f.only_goodput, "--heldout/--tuning: run only the goodput mode (quicker)");
  app.add_option("--twice-below", f.twice_below,
                 "--heldout/--tuning: where goodput is under this ratio, also run the trace with its arrivals "
                 "played twice (listed by --list-below)");
  app.add_option("--list-below", f.list_below,
                 "--heldout/--tuning: list the traces where an adaptive mode is under this ratio");
  ferry::scheduler::AddReplicaFlags(app, f);
  app.add_option("--initial-num-seqs", f.initial_num_seqs, "goodput mode's cap until its model has data (0: max/4)");
  app.add_option("--num-kv-blocks", f.num_kv_blocks, "KV pool (0: from the preset)");
  app.add_flag("--sweep", f.sweep, "static-cap sweep in the seed's table shape");
  app.add_flag("--compare", f.compare, "goodput of every static cap, load-level and goodput");
  app.add_option("--caps", f.caps, "caps for --sweep/--compare")->delimiter(',');
  app.add_option("--timeout-s", f.timeout_s, "--sweep success: e2e latency within this");
  app.add_option("--json", f.json_path, "write the report as JSON");
  app.add_option("--write-results", f.results_path,
                 "write one JSON line per request: its latencies and whether it met its SLO");
  CLI11_PARSE(app, argc, argv);
  // The trace's lanes state the targets (the SLO lanes' are --slo-ttft-ms and --slo-tpot-ms), so the
  // adaptive modes always have them, as a scheduler started with --slo-lane does.
  f.targets_stated = true;
  f.has_family_seed = app.count("--family-seed") > 0;
  if (!FlagsAreValid(f)) return 2;
  try {
    if (f.heldout || f.tuning_num_seeds > 0) return RunHeldOutMode(f, app);
    const ferry::CostModel cost(LoadPreset(f.preset));
    if (f.has_family_seed) f.batch_lane_scale = TimeScale(HeldOutOptions{}, cost.params().name);
    if (f.sweep) return RunSweepMode(f, cost);
    const std::vector<TraceRequest> trace = LoadWorkload(f, cost);
    if (!f.write_trace.empty()) WriteTrace(f.write_trace, trace);
    if (f.compare) return RunCompareMode(f, cost, trace);
    return RunOnce(f, cost, trace);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry-sim: %s\n", e.what());
    return 1;
  }
}
