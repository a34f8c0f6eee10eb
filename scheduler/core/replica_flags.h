// The flags of a scheduler replica, defined once for the two binaries that build one (issue #54):
// ferry-scheduler and ferry-sim register these, with one name, default, check and help each, so a
// decision tuned in the simulator is the one the live scheduler takes under the same command line.
// Each binary adds its own flags beside them (the scheduler its workers and lanes, the simulator its
// workload and presets) and turns these into the replica's configuration with the functions below.
#pragma once

#include <string>
#include <vector>

#include "scheduler/cap/controller.h"
#include "scheduler/core/types.h"

namespace CLI {
class App;
}

namespace ferry::scheduler {

struct ReplicaFlags {
  int max_num_seqs = 256;
  int min_num_seqs = 1;
  // The mode that holds the held-out criterion best (docs/benchmarks/scheduler.md section 7);
  // --max-num-seqs is its upper bound, and static keeps the cap there (vLLM's fixed cap).
  std::string controller_mode = "goodput";
  double slo_ttft_ms = 1000;
  double slo_tpot_ms = 50;
  double slo_percentile = 95;
  bool serve_late_last = true;  // scheduler.md 7g: in an overload, on-time requests first
  std::vector<std::string> lane_ttft;  // LANE=MS (ParseLaneTtft)
  bool enable_prefix_caching = true;  // vLLM V1's default: a preempted sequence resumes from cache
  int max_num_batched_tokens = 8192;
  // Set by NoteStated after parsing: --slo-ttft-ms or --slo-tpot-ms given (SloOptions::targets_stated; a
  // binary with more ways to state a target, such as ferry-scheduler's --slo-lane, adds its own).
  bool targets_stated = false;
};

// Registers --max-num-seqs, --min-num-seqs, --controller-mode, --slo-ttft-ms, --slo-tpot-ms,
// --slo-percentile, --[no-]serve-late-last, --lane-ttft-ms, --[no-]enable-prefix-caching and
// --max-num-batched-tokens on `app`, writing into `flags`.
void AddReplicaFlags(CLI::App& app, ReplicaFlags& flags);
// After parsing: what the command line stated (ReplicaFlags::targets_stated).
void NoteStated(const CLI::App& app, ReplicaFlags& flags);

// The batching half of the configuration: max_num_seqs, max_num_batched_tokens, enable_prefix_caching and
// serve_late_last. The rest of `config` is kept: the lanes' targets are each binary's to assemble
// (StatedLaneTargets, then LaneTargets in replica.h).
void ApplyTo(const ReplicaFlags& flags, SchedulerConfig& config);
// The targets --lane-ttft-ms states, in order (throws std::invalid_argument on a bad one; the flag's own
// check refuses those at parse time).
std::vector<LaneTtft> StatedLaneTargets(const ReplicaFlags& flags);
// The cap controller's half: mode, bounds and targets; the rest of `base` is kept.
ControllerOptions ControllerOptionsFrom(const ReplicaFlags& flags, ControllerOptions base = {});

}  // namespace ferry::scheduler
