// A family of generated traces for judging a controller on workloads it was
// not tuned on (issue #30). One seed draws one member: an arrival process
// (Poisson, gamma bursts, a diurnal sinusoid, a spike, on/off), a length mix
// (chat-like or RAG-like, log-normal with random medians and spreads), the
// interactive share, the share of requests that open with one of a few
// shared prefixes, and a load relative to the preset's capacity. Members are
// deterministic for (seed, preset): the preset only sets the arrival rate.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/cost_model.h"
#include "scheduler/core/types.h"
#include "scheduler/sim/workload.h"

namespace ferry::sim {

// Every member's arrival window. Long enough for several diurnal periods and
// on/off cycles, short enough that the held-out evaluation runs in minutes.
inline constexpr double kFamilyDurationS = 60;
inline constexpr double kFamilyMinLoad = 0.5;
inline constexpr double kFamilyMaxLoad = 1.4;
// The TPOT that defines capacity: the middle of the held-out evaluation's
// SLOs (2.5, 3, 4 ms), so a load of 1 is what the preset holds at the middle
// SLO and the drawn loads straddle the SLOs on both sides.
inline constexpr double kCapacityReferenceTpotS = 0.003;
// The largest batch the capacity definition considers.
inline constexpr int32_t kCapacityMaxNumSeqs = 256;

struct FamilyMember {
  uint64_t seed = 0;
  WorkloadOptions workload;  // arrivals.rate_per_s already set from load x capacity
  std::string length_mix;    // "chat" or "rag"
  double load = 0;           // mean arrival rate over the window / capacity_per_s
  double capacity_per_s = 0;
  int32_t capacity_num_seqs = 0;  // the batch the capacity was computed at
  double interactive_share = 0;
  double prefix_share = 0;
  double mean_prompt_tokens = 0;  // of the drawn distributions (before clipping)
  double mean_output_tokens = 0;
};

// Draws member `seed` for the preset's cost model (and the sim's default
// scheduler config: its step budget and KV pool).
FamilyMember DrawFamilyMember(uint64_t seed, const CostModelParams& preset);
std::vector<TraceRequest> GenerateFamilyTrace(const FamilyMember& member);
// One line: seed, arrival kind and its parameters, lengths, shares, load.
std::string DescribeMember(const FamilyMember& member);

// Capacity in requests/s of a preset for requests of the given mean lengths,
// from the cost model alone (no trace, no simulation). A batch of B requests
// is served as: every prompt prefilled in steps of the config's token budget,
// then mean_output decode steps of B sequences at the mean context (the KV
// read is linear in it, so the mean is exact). B is the largest batch up to
// kCapacityMaxNumSeqs whose time per output token (batch time / mean_output,
// prefill included, as a request's TPOT includes the prefills interleaved
// with its decode) is within reference_tpot_s and whose KV fits the pool
// (B = 1 when none is); capacity = B / batch time. `num_seqs`, if given,
// receives B.
double ReferenceCapacityPerS(const CostModel& cost, const scheduler::SchedulerConfig& config,
                             double mean_prompt_tokens, double mean_output_tokens,
                             double reference_tpot_s = kCapacityReferenceTpotS,
                             int32_t* num_seqs = nullptr);

}  // namespace ferry::sim
