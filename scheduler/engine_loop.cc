#include "scheduler/engine_loop.h"

#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/metrics.h"

namespace ferry::scheduler {

namespace {
const char* FinishName(FinishKind kind) {
  switch (kind) {
    case FinishKind::kNone: return "none";
    case FinishKind::kLength: return "length";
    case FinishKind::kEos: return "eos";
    case FinishKind::kStopToken: return "stop";
    case FinishKind::kAborted: return "aborted";
    case FinishKind::kCancelled: return "cancelled";
  }
  return "unknown";
}
}  // namespace

struct LoopMetrics {
  explicit LoopMetrics(prometheus::Registry& r)
      : requests(prometheus::BuildGauge().Name("ferry_scheduler_requests")
                     .Help("Requests in the scheduler by state").Register(r)),
        running(requests.Add({{"state", "running"}})),
        waiting(requests.Add({{"state", "waiting"}})),
        blocks(prometheus::BuildGauge().Name("ferry_scheduler_kv_blocks")
                   .Help("KV cache blocks by state").Register(r)),
        blocks_used(blocks.Add({{"state", "used"}})),
        blocks_free(blocks.Add({{"state", "free"}})),
        kv_usage(prometheus::BuildGauge().Name("ferry_scheduler_kv_cache_usage_ratio")
                     .Help("Fraction of KV blocks in use").Register(r).Add({})),
        finished(prometheus::BuildCounter().Name("ferry_scheduler_requests_finished_total")
                     .Help("Requests ended, by reason").Register(r)),
        steps(prometheus::BuildCounter().Name("ferry_scheduler_steps_total")
                  .Help("Engine steps run").Register(r).Add({})),
        step_seconds(prometheus::BuildHistogram().Name("ferry_scheduler_step_duration_seconds")
                         .Help("Wall time of one step, plan to commit").Register(r)
                         .Add({}, LatencyBucketsSeconds())),
        scheduled_tokens(prometheus::BuildCounter().Name("ferry_scheduler_scheduled_tokens_total")
                             .Help("Tokens scheduled for computation").Register(r).Add({})),
        max_num_seqs(prometheus::BuildGauge().Name("ferry_scheduler_max_num_seqs")
                         .Help("Current cap on sequences per step").Register(r).Add({})) {}
  prometheus::Family<prometheus::Gauge>& requests;
  prometheus::Gauge& running;
  prometheus::Gauge& waiting;
  prometheus::Family<prometheus::Gauge>& blocks;
  prometheus::Gauge& blocks_used;
  prometheus::Gauge& blocks_free;
  prometheus::Gauge& kv_usage;
  prometheus::Family<prometheus::Counter>& finished;
  prometheus::Counter& steps;
  prometheus::Histogram& step_seconds;
  prometheus::Counter& scheduled_tokens;
  prometheus::Gauge& max_num_seqs;
};

EngineLoop::EngineLoop(const SchedulerConfig& config, WorkerGroup& workers, prometheus::Registry& registry)
    : config_(config), workers_(workers), metrics_(std::make_unique<LoopMetrics>(registry)), core_(config) {
  // Pre-create every outcome so the series exist (at 0) before the first one.
  for (auto kind : {FinishKind::kLength, FinishKind::kEos, FinishKind::kStopToken, FinishKind::kAborted,
                    FinishKind::kCancelled}) {
    metrics_->finished.Add({{"reason", FinishName(kind)}});
  }
  metrics_->max_num_seqs.Set(config.max_num_seqs);
  UpdateGauges();
  thread_ = std::thread([this] { Run(); });
}

EngineLoop::~EngineLoop() {
  {
    std::lock_guard lock(inbox_mu_);
    stopping_ = true;
  }
  inbox_cv_.notify_one();
  thread_.join();
}

std::pair<uint64_t, std::shared_ptr<RequestChannel>> EngineLoop::Submit(RequestSpec spec) {
  const int64_t total = static_cast<int64_t>(spec.prompt.size()) + spec.max_tokens;
  if (total > config_.max_model_len) {
    throw std::invalid_argument(fmt::format(
        "prompt tokens ({}) + max_tokens ({}) = {} exceeds max_model_len {}", spec.prompt.size(),
        spec.max_tokens, total, config_.max_model_len));
  }
  spec.seq_id = next_seq_id_.fetch_add(1);
  auto channel = std::make_shared<RequestChannel>();
  const uint64_t id = spec.seq_id;
  num_live_.fetch_add(1);
  {
    std::lock_guard lock(inbox_mu_);
    inbox_.push_back(AddCommand{std::move(spec), channel});
  }
  inbox_cv_.notify_one();
  return {id, channel};
}

void EngineLoop::Cancel(uint64_t seq_id) {
  {
    std::lock_guard lock(inbox_mu_);
    inbox_.push_back(CancelCommand{seq_id});
  }
  inbox_cv_.notify_one();
}

void EngineLoop::Run() {
  std::vector<Command> commands;
  while (true) {
    {
      std::unique_lock lock(inbox_mu_);
      // Idle: sleep until a command arrives. Busy: take what is there and step.
      const bool idle = !core_.has_work();
      if (idle) inbox_cv_.wait(lock, [&] { return stopping_ || !inbox_.empty(); });
      if (stopping_) break;
      commands.swap(inbox_);
    }
    DrainInbox(commands);
    RunStep();
  }
  Dispatch(core_.AbortAll());
}

void EngineLoop::DrainInbox(std::vector<Command>& commands) {
  for (Command& command : commands) Apply(command);
  commands.clear();
}

void EngineLoop::Apply(Command& command) {
  if (auto* add = std::get_if<AddCommand>(&command)) {
    const uint64_t id = add->spec.seq_id;
    try {
      core_.Add(std::move(add->spec));
      channels_.emplace(id, add->channel);
    } catch (const std::exception& e) {
      spdlog::warn("seq {} rejected: {}", id, e.what());
      num_live_.fetch_sub(1);
      metrics_->finished.Add({{"reason", "aborted"}}).Increment();
      add->channel->Push(SeqEvent{.seq_id = id, .finish = FinishKind::kAborted});
    }
    return;
  }
  const uint64_t id = std::get<CancelCommand>(command).seq_id;
  auto it = channels_.find(id);
  if (it == channels_.end()) return;  // already ended
  core_.Cancel(id);
  auto channel = it->second;
  channels_.erase(it);
  num_live_.fetch_sub(1);
  metrics_->finished.Add({{"reason", "cancelled"}}).Increment();
  channel->Push(SeqEvent{.seq_id = id, .finish = FinishKind::kCancelled});
}

void EngineLoop::RunStep() {
  const auto start = Clock::now();
  StepPlan plan = core_.Plan(Budget{config_.max_num_seqs, config_.max_num_batched_tokens}, start);
  if (plan.empty()) {
    UpdateGauges();
    return;
  }
  for (const auto& seq : plan.new_sequences) {
    auto it = channels_.find(seq.seq_id);
    if (it != channels_.end()) it->second->MarkStarted(start);
  }
  std::vector<SeqEvent> events;
  try {
    events = core_.Commit(plan, workers_.Execute(plan.step_id, plan));
  } catch (const std::exception& e) {
    spdlog::error("step failed, aborting all sequences: {}", e.what());
    events = core_.AbortAll();
  }
  int64_t tokens = 0;
  for (const auto& s : plan.scheduled) tokens += s.num_tokens;
  metrics_->scheduled_tokens.Increment(static_cast<double>(tokens));
  metrics_->steps.Increment();
  metrics_->step_seconds.Observe(std::chrono::duration<double>(Clock::now() - start).count());
  Dispatch(events);
  UpdateGauges();
}

void EngineLoop::Dispatch(const std::vector<SeqEvent>& events) {
  for (const SeqEvent& event : events) {
    auto it = channels_.find(event.seq_id);
    if (it == channels_.end()) continue;
    auto channel = it->second;
    if (event.finish != FinishKind::kNone) {
      // Bookkeeping before the push: whoever sees the final event sees it done.
      metrics_->finished.Add({{"reason", FinishName(event.finish)}}).Increment();
      channels_.erase(it);
      num_live_.fetch_sub(1);
    }
    channel->Push(event);
  }
}

void EngineLoop::UpdateGauges() {
  metrics_->running.Set(static_cast<double>(core_.num_running()));
  metrics_->waiting.Set(static_cast<double>(core_.num_waiting()));
  const double total = core_.num_total_blocks(), free = core_.num_free_blocks();
  metrics_->blocks_used.Set(total - free);
  metrics_->blocks_free.Set(free);
  metrics_->kv_usage.Set(total > 0 ? (total - free) / total : 0.0);
}

}  // namespace ferry::scheduler
