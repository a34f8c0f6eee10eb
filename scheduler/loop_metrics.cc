#include "scheduler/loop_metrics.h"

#include "common/metrics.h"

namespace ferry::scheduler {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

LoopMetrics::LoopMetrics(prometheus::Registry& r, int32_t num_ranks)
    : requests(BuildGauge().Name("ferry_scheduler_requests").Help("Requests in the scheduler by state").Register(r)),
      running(requests.Add({{"state", "running"}})),
      waiting(requests.Add({{"state", "waiting"}})),
      blocks(BuildGauge().Name("ferry_scheduler_kv_blocks").Help("KV cache blocks by state").Register(r)),
      blocks_used(blocks.Add({{"state", "used"}})),
      blocks_free(blocks.Add({{"state", "free"}})),
      kv_usage(BuildGauge().Name("ferry_scheduler_kv_cache_usage_ratio").Help("Fraction of KV blocks in use")
                   .Register(r).Add({})),
      finished(BuildCounter().Name("ferry_scheduler_requests_finished_total").Help("Requests ended, by reason")
                   .Register(r)),
      steps(BuildCounter().Name("ferry_scheduler_steps_total").Help("Engine steps run").Register(r).Add({})),
      step_seconds(BuildHistogram().Name("ferry_scheduler_step_duration_seconds")
                       .Help("Wall time of one step, from when the workers could start it to its samples").Register(r)
                       .Add({}, LatencyBucketsSeconds())),
      step_sequences(BuildHistogram().Name("ferry_scheduler_step_sequences").Help("Sequences in one step")
                         .Register(r).Add({}, prometheus::Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64, 128, 256})),
      step_tokens(BuildHistogram().Name("ferry_scheduler_step_tokens")
                      .Help("Tokens computed in one step (prefill chunks and decodes)").Register(r)
                      .Add({}, prometheus::Histogram::BucketBoundaries{1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096,
                                                                       8192, 16384})),
      scheduled_tokens(BuildCounter().Name("ferry_scheduler_scheduled_tokens_total")
                           .Help("Tokens scheduled for computation").Register(r).Add({})),
      max_num_seqs(BuildGauge().Name("ferry_scheduler_max_num_seqs").Help("Current cap on sequences per step")
                       .Register(r).Add({})),
      level_series(BuildGauge().Name("ferry_scheduler_load_level").Help("1 for the controller's current level")
                       .Register(r)),
      regime_series(BuildGauge().Name("ferry_scheduler_controller_regime")
                        .Help("1 for what the cap controller optimises now: goodput (the targets are within reach), "
                              "unreachable (no cap serves a quarter of the requests within them: the most completions), "
                              "no-targets (none stated: the cap at its bound), static")
                        .Register(r)),
      cap_changes(BuildCounter().Name("ferry_scheduler_cap_changes_total")
                      .Help("Changes of max_num_seqs by the controller or admin, by kind").Register(r)),
      preemptions(BuildCounter().Name("ferry_scheduler_preemptions_total")
                      .Help("Sequences preempted (recomputed later) for lack of KV blocks").Register(r).Add({})),
      prefix_queries(BuildCounter().Name("ferry_scheduler_prefix_cache_queries_total")
                         .Help("Full KV blocks looked up in the prefix cache").Register(r).Add({})),
      prefix_hits(BuildCounter().Name("ferry_scheduler_prefix_cache_hits_total")
                      .Help("Full KV blocks reused from the prefix cache").Register(r).Add({})),
      worker_losses(BuildCounter().Name("ferry_scheduler_worker_losses_total")
                        .Help("Worker groups lost (a rank disconnected or missed the step timeout), by reason")
                        .Register(r)),
      worker_restarts(BuildCounter().Name("ferry_scheduler_worker_restarts_total")
                          .Help("Worker ranks that came back with a new incarnation id after a loss").Register(r)),
      requests_resumed(BuildCounter().Name("ferry_scheduler_requests_resumed_total")
                           .Help("Requests kept across a lost worker group and resumed by recompute").Register(r)
                           .Add({})),
      requests_failed_by_loss(BuildCounter().Name("ferry_scheduler_requests_failed_by_loss_total")
                                  .Help("Requests ended UNAVAILABLE: their worker group was not back in time")
                                  .Register(r).Add({})),
      recovery_seconds(BuildHistogram().Name("ferry_scheduler_worker_recovery_seconds")
                           .Help("Time from a worker group's loss until it serves again").Register(r)
                           .Add({}, prometheus::Histogram::BucketBoundaries{0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300,
                                                                            600})),
      recovering(BuildGauge().Name("ferry_scheduler_worker_recovering")
                     .Help("1 while the replica waits for a lost worker group, else 0").Register(r).Add({})),
      lora_info(BuildGauge().Name("ferry_scheduler_lora_requests_info")
                    .Help("LoRA adapters running and waiting and the bound (labels), as vLLM's "
                          "lora_requests_info; one series, at 1")
                    .Register(r)) {
  for (const char* reason : {"disconnected", "step_timeout"}) worker_losses.Add({{"reason", reason}});
  for (int32_t rank = 0; rank < num_ranks; ++rank) worker_restarts.Add({{"rank", std::to_string(rank)}});
  // Every outcome exists (at 0) before the first one happens.
  for (auto kind : {FinishKind::kLength, FinishKind::kEos, FinishKind::kStopToken, FinishKind::kAborted,
                    FinishKind::kCancelled, FinishKind::kUnavailable}) {
    finished.Add({{"reason", FinishKindName(kind)}});
  }
}

void LoopMetrics::SetLoraInfo(const std::string& running, const std::string& waiting, int32_t max_lora) {
  if (lora_series_ != nullptr && running == lora_running_ && waiting == lora_waiting_) return;
  if (lora_series_ != nullptr) lora_info.Remove(lora_series_);
  lora_series_ = &lora_info.Add({{"running_lora_adapters", running},
                                 {"waiting_lora_adapters", waiting},
                                 {"max_lora", std::to_string(max_lora)}});
  lora_series_->Set(1);
  lora_running_ = running;
  lora_waiting_ = waiting;
}

void LoopMetrics::SetOneHot(prometheus::Family<prometheus::Gauge>& family, const char* label, std::string& current,
                            const std::string& name) {
  if (name == current) return;
  if (!current.empty()) family.Add({{label, current}}).Set(0);
  family.Add({{label, name}}).Set(1);
  current = name;
}

}  // namespace ferry::scheduler
