#include "scheduler/core/replica_flags.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <stdexcept>

#include "scheduler/cap/cap_mode.h"
#include "scheduler/core/scheduler_core.h"

namespace ferry::scheduler {
namespace {

// Refuses a malformed LANE=MS when the command line is parsed, before a binary waits for anything.
std::string CheckLaneTtft(const std::string& spec) {
  try {
    ParseLaneTtft(spec);
    return std::string();
  } catch (const std::invalid_argument& e) {
    return std::string(e.what());
  }
}

void AddCapFlags(CLI::App& app, ReplicaFlags& f) {
  app.add_option("--max-num-seqs", f.max_num_seqs, "Most sequences in one step (the controller's upper bound)")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  app.add_option("--min-num-seqs", f.min_num_seqs, "The adaptive controller's lower bound")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  app.add_option("--controller-mode", f.controller_mode,
                 "How max_num_seqs follows the load: goodput (default: the cap with the most expected requests "
                 "within --slo-ttft-ms and --slo-tpot-ms, up to --max-num-seqs; the most completions when no cap "
                 "serves a quarter of the requests within them, first come, first served; with no target stated, "
                 "the largest cap the KV pool holds), load-level, static (fixed at --max-num-seqs); slo is the "
                 "same as goodput")
      ->check(CLI::IsMember(ControllerModeValues()))
      ->capture_default_str();
  app.add_option("--slo-ttft-ms", f.slo_ttft_ms,
                 "goodput and load-level modes: the SLO lanes' time-to-first-token target (1000 when only "
                 "another target is stated; with no target stated these modes keep the cap at its bound); "
                 "--serve-late-last: the target of an SLO lane without --lane-ttft-ms")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--slo-tpot-ms", f.slo_tpot_ms,
                 "goodput and load-level modes: the SLO lanes' time-per-output-token target (50 when only "
                 "another target is stated)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--slo-percentile", f.slo_percentile,
                 "Percentile of the windowed TTFT and TPOT the controller reports")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
}

void AddQueueFlags(CLI::App& app, ReplicaFlags& f) {
  app.add_flag("--serve-late-last,!--no-serve-late-last", f.serve_late_last,
               "Within a priority, serve a request still waiting past its lane's first-token target "
               "(--lane-ttft-ms, or --slo-ttft-ms for an SLO lane), or whose prefill no longer fits in the time it has "
               "left at the measured cost of a prompt token, after those that can still meet theirs, "
               "each in arrival order (default on; lanes without a target are first come, first served)");
  app.add_option("--lane-ttft-ms", f.lane_ttft,
                 "LANE=MS: the time to first token this lane's requests aim at, for --serve-late-last and for "
                 "what counts as good (repeatable; a lane not given one: --slo-ttft-ms if it is an SLO lane, "
                 "else never late). For a lane outside the SLO lanes it is also the wait the goodput planner "
                 "lets that lane's queue take (0.85 of the tightest such target; without one, 20x --slo-ttft-ms)")
      ->check(CheckLaneTtft);
  app.add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", f.enable_prefix_caching,
               "Share full KV blocks of identical prefixes (default on)");
  app.add_option("--max-num-batched-tokens", f.max_num_batched_tokens, "Most tokens computed in one step")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
}

}  // namespace

void AddReplicaFlags(CLI::App& app, ReplicaFlags& flags) {
  AddCapFlags(app, flags);
  AddQueueFlags(app, flags);
}

void NoteStated(const CLI::App& app, ReplicaFlags& flags) {
  flags.targets_stated = app.count("--slo-ttft-ms") + app.count("--slo-tpot-ms") > 0;
}

void ApplyTo(const ReplicaFlags& flags, SchedulerConfig& config) {
  config.max_num_seqs = flags.max_num_seqs;
  config.max_num_batched_tokens = flags.max_num_batched_tokens;
  config.enable_prefix_caching = flags.enable_prefix_caching;
  config.serve_late_last = flags.serve_late_last;
}

std::vector<LaneTtft> StatedLaneTargets(const ReplicaFlags& flags) {
  std::vector<LaneTtft> out;
  for (const std::string& spec : flags.lane_ttft) out.push_back(ParseLaneTtft(spec));
  return out;
}

ControllerOptions ControllerOptionsFrom(const ReplicaFlags& flags, ControllerOptions c) {
  c.mode = ParseControllerMode(flags.controller_mode);
  c.min_num_seqs = std::min(flags.min_num_seqs, flags.max_num_seqs);
  c.max_num_seqs = flags.max_num_seqs;
  c.slo.ttft_target_s = flags.slo_ttft_ms / 1000.0;
  c.slo.tpot_target_s = flags.slo_tpot_ms / 1000.0;
  c.slo.percentile = flags.slo_percentile;
  c.slo.targets_stated = flags.targets_stated;
  return c;
}

}  // namespace ferry::scheduler
