#include "scheduler/engine_loop.h"

#include <algorithm>
#include <stdexcept>

#include <spdlog/fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "scheduler/loop_metrics.h"

namespace ferry::scheduler {

namespace {

ControllerOptions StaticCap(const SchedulerConfig& config) {
  ControllerOptions options;
  options.mode = ControllerMode::kStatic;
  options.min_num_seqs = 1;
  options.max_num_seqs = config.max_num_seqs;
  return options;
}

}  // namespace

EngineLoop::EngineLoop(const SchedulerConfig& config, WorkerGroup& workers, prometheus::Registry& registry)
    : EngineLoop(config, StaticCap(config), workers, registry) {}

EngineLoop::EngineLoop(const SchedulerConfig& config, const ControllerOptions& controller, WorkerGroup& workers,
                       prometheus::Registry& registry, const RecoveryOptions& recovery)
    : config_(config),
      recovery_(recovery),
      workers_(workers),
      metrics_(std::make_unique<LoopMetrics>(registry, recovery.num_ranks)),
      start_(Clock::now()),
      replica_(config, controller),
      lora_(config.lora_modules) {
  state_.lora_names = lora_.Names();
  // Every plan the pipeline can hold at once (in flight, being planned) fits without growing: a moment with
  // none in flight (the pipeline's timing shifts under load) once grew the spares in a steady state (#53).
  in_flight_.reserve(static_cast<size_t>(config.max_steps_in_flight) + 1);
  spare_plans_.reserve(static_cast<size_t>(config.max_steps_in_flight) + 2);
  // The cap and the level show from the start, not only once the first step ran.
  ExportCap(replica_.controller().num_seqs());
  Publish();
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

void EngineLoop::Push(Command command) {
  {
    std::lock_guard lock(inbox_mu_);
    inbox_.push_back(std::move(command));
  }
  inbox_cv_.notify_one();
}

uint64_t EngineLoop::Submit(RequestSpec spec, std::shared_ptr<EventSink> sink, uint64_t tag) {
  // The core's own check, here on the caller's thread so that the call is refused at once.
  if (const std::string error = SchedulerCore::RequestError(spec, config_); !error.empty()) {
    throw std::invalid_argument(error);
  }
  spec.seq_id = next_seq_id_.fetch_add(1);
  const uint64_t id = spec.seq_id;
  num_live_.fetch_add(1);
  Push(AddCommand{std::move(spec), std::move(sink), tag});
  return id;
}

void EngineLoop::Cancel(uint64_t seq_id) { Push(CancelCommand{seq_id}); }

LoopState EngineLoop::SetMaxNumSeqs(int32_t max_num_seqs, bool hold) {
  auto done = std::make_shared<std::promise<void>>();
  auto applied = done->get_future();
  Push(SetCapCommand{max_num_seqs, hold, done});
  applied.wait();
  return State();
}

namespace {
constexpr const char* kNoAdapters = "this replica serves no LoRA adapters: start its workers with --enable-lora";
}  // namespace

LoraChange EngineLoop::LoadLora(const std::string& name, const std::string& path) {
  using Code = LoraChange::Code;
  if (config_.max_loras == 0) return {Code::kFailedPrecondition, kNoAdapters, {}};
  if (const std::vector<std::string> names = LoraNames(); std::binary_search(names.begin(), names.end(), name)) {
    return {Code::kAlreadyExists, fmt::format("lora_name \"{}\" is already loaded: unload it first", name), names};
  }
  // A key of its own: a reload never meets the old weights or a prefix computed under them.
  const std::string key = fmt::format("{}#{}", name, next_lora_key_.fetch_add(1));
  try {
    workers_.LoadLora(key, path);  // the long part (reading the adapter), off the loop thread
  } catch (const std::invalid_argument& e) {
    return {Code::kInvalidArgument, std::string(e.what()), LoraNames()};
  } catch (const std::exception& e) {
    return {Code::kUnavailable, fmt::format("loading lora_name \"{}\": {}", name, e.what()), LoraNames()};
  }
  auto done = std::make_shared<std::promise<LoraChange>>();
  auto applied = done->get_future();
  Push(LoraCommand{name, key, path, done});
  return applied.get();
}

LoraChange EngineLoop::UnloadLora(const std::string& name) {
  if (config_.max_loras == 0) return {LoraChange::Code::kFailedPrecondition, kNoAdapters, {}};
  auto done = std::make_shared<std::promise<LoraChange>>();
  auto applied = done->get_future();
  Push(LoraCommand{name, "", "", done});
  return applied.get();
}

std::vector<std::string> EngineLoop::LoraNames() const {
  std::lock_guard lock(state_mu_);
  return state_.lora_names;
}

void EngineLoop::RecordReplica(std::vector<ReplicaInput>* record) {
  auto done = std::make_shared<std::promise<void>>();
  auto applied = done->get_future();
  Push(RecordCommand{record, done});
  applied.wait();
}

LoopState EngineLoop::State() const {
  std::lock_guard lock(state_mu_);
  return state_;
}

void EngineLoop::Run() {
  std::vector<Command> commands;
  const auto depth = static_cast<size_t>(config_.max_steps_in_flight);
  while (true) {
    bool idle_check = false;  // idle for a whole idle_check_interval: ask the workers
    {
      std::unique_lock lock(inbox_mu_);
      // Lost workers: wake for commands and for the next probe. Idle: sleep until a command arrives.
      if (lost_) {
        inbox_cv_.wait_until(lock, NextRecoveryWake(), [&] { return stopping_ || !inbox_.empty(); });
      } else if (!replica_.core().has_work() && in_flight_.empty()) {
        idle_check = !inbox_cv_.wait_for(lock, recovery_.idle_check_interval,
                                         [&] { return stopping_ || !inbox_.empty(); });
      }
      if (stopping_) break;
      commands.swap(inbox_);
    }
    if (idle_check) CheckIdle();
    for (Command& command : commands) Apply(command);
    commands.clear();
    if (lost_) {
      Recover();
      FlushSinks();
      continue;
    }
    // With room in the pipeline the next step is planned and sent first: the
    // workers start it the moment they finish the one before, while this
    // thread commits that one and delivers its tokens.
    const bool launched = in_flight_.size() < depth && LaunchStep();
    if (!in_flight_.empty() && (!launched || in_flight_.size() >= depth)) CompleteStep();
    RetireAdapters();
    // One flush a turn: a step's start events (from LaunchStep) go out with the tokens of the
    // step completed after it, one message per session rather than two.
    FlushSinks();
  }
  // Steps already sent finish (the workers run them anyway); what is left ends aborted, or
  // unavailable if the workers are gone.
  while (!in_flight_.empty() && !lost_) CompleteStep();
  const TimePoint now = Clock::now();
  Dispatch(replica_.AbortAll(lost_ ? FinishKind::kUnavailable : FinishKind::kAborted), now);
  FlushSinks();
}

void EngineLoop::FlushSinks() {
  for (const auto& sink : touched_) sink->Flush();
  touched_.clear();
}

void EngineLoop::Apply(Command& command) {
  const TimePoint now = Clock::now();
  if (auto* add = std::get_if<AddCommand>(&command)) {
    const uint64_t id = add->spec.seq_id;
    // The deadline is checked between steps: end a step early enough that the final event
    // still reaches the client before its own deadline cancels the call. The margin covers two
    // steps and the hops back (at least 20 ms, and a tenth of the request's budget up to 250 ms,
    // since those hops slow down exactly when the machine is loaded).
    if (add->spec.deadline != TimePoint::max()) {
      const auto budget_share = std::min<Clock::duration>(std::chrono::milliseconds(250),
                                                          (add->spec.deadline - add->spec.arrival) / 10);
      const auto margin = std::max({deadline_margin_, budget_share,
                                    std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(2 * last_step_s_))});
      add->spec.deadline -= margin;
    }
    if (down_) {  // the workers are gone past the recovery timeout: another replica may serve it
      return RefuseAdd(*add, SeqEvent{.seq_id = id, .finish = FinishKind::kUnavailable});
    }
    if (!add->spec.lora_name.empty() && !ResolveAdapter(*add)) return;
    try {
      replica_.Add(std::move(add->spec));
      streams_.emplace(id, Stream{std::move(add->sink), add->tag, std::nullopt});
    } catch (const std::exception& e) {
      spdlog::warn("seq {} rejected: {}", id, e.what());
      RefuseAdd(*add, SeqEvent{.seq_id = id, .finish = FinishKind::kAborted});
    }
  } else if (auto* cancel = std::get_if<CancelCommand>(&command)) {
    if (!streams_.count(cancel->seq_id)) return;  // already ended
    replica_.Cancel(cancel->seq_id);
    Dispatch({SeqEvent{.seq_id = cancel->seq_id, .finish = FinishKind::kCancelled}}, now);
  } else if (auto* lora = std::get_if<LoraCommand>(&command)) {
    ApplyLora(*lora);
  } else if (auto* record = std::get_if<RecordCommand>(&command)) {
    replica_.Record(record->record);
    record->done->set_value();
  } else {
    auto& set = std::get<SetCapCommand>(command);
    replica_.SetCap(set.max_num_seqs, Seconds(now), set.hold);
    ReportCap(replica_.controller().num_seqs());  // the change shows now, not at the next step
    Publish();
    set.done->set_value();
  }
}

bool EngineLoop::ResolveAdapter(AddCommand& add) {
  if (std::optional<std::string> key = lora_.Key(add.spec.lora_name)) {
    add.spec.lora_name = std::move(*key);
    return true;
  }
  RefuseAdd(add, SeqEvent{.seq_id = add.spec.seq_id,
                          .finish = FinishKind::kNotFound,
                          .error = fmt::format("lora_name = \"{}\" is not served by this replica (unloaded)",
                                               add.spec.lora_name)});
  return false;
}

void EngineLoop::RefuseAdd(AddCommand& add, const SeqEvent& last) {
  num_live_.fetch_sub(1);
  metrics_->Finished(last.finish);
  add.sink->Deliver(add.tag, last);
  add.sink->Flush();
}

void EngineLoop::ApplyLora(LoraCommand& command) {
  LoraChange change;
  if (!command.key.empty()) {  // a load, read by the workers already
    if (lora_.Serves(command.name)) {  // a concurrent load of the same name got there first
      lora_.AddRetiring(command.name, command.key, command.path);
      change = {LoraChange::Code::kAlreadyExists,
                fmt::format("lora_name \"{}\" is already loaded: unload it first", command.name), {}};
    } else {
      lora_.Add(command.name, command.key, command.path);
      spdlog::info("LoRA adapter {} served (as {}, from {})", command.name, command.key, command.path);
    }
  } else if (!lora_.Serves(command.name)) {
    change = {LoraChange::Code::kNotFound, fmt::format("lora_name \"{}\" is not loaded", command.name), {}};
  } else {
    const std::string key = lora_.Remove(command.name);
    spdlog::info("LoRA adapter {} unloaded: new requests are refused; {} drops it after its last request", command.name,
                 key);
  }
  change.names = lora_.Names();
  {
    std::lock_guard lock(state_mu_);
    state_.lora_names = change.names;
  }
  RetireAdapters();  // one no request runs under goes at once
  command.done->set_value(std::move(change));
}

void EngineLoop::RetireAdapters() {
  if (lora_.retiring().empty() || lost_) return;  // a lost group drops nothing: Resume reloads what it holds
  replica_.core().LoraAdapters(lora_running_, lora_waiting_);
  const std::vector<std::string> retiring = lora_.retiring();
  for (const std::string& key : retiring) {
    if (std::binary_search(lora_running_.begin(), lora_running_.end(), key) ||
        std::binary_search(lora_waiting_.begin(), lora_waiting_.end(), key)) {
      continue;  // requests accepted under it still run
    }
    try {
      workers_.UnloadLora(key);
    } catch (const std::exception& e) {  // the rank is gone: its replacement never had it
      spdlog::warn("LoRA adapter {}: a worker did not drop it: {}", key, e.what());
    }
    spdlog::info("LoRA adapter {} ({}) dropped by the workers", lora_.NameOf(key), key);
    lora_.Dropped(key);
  }
}

void EngineLoop::ReportCap(int32_t cap) {
  for (const CapChange& change : replica_.TakeChanges()) {
    spdlog::info("max_num_seqs {} -> {} ({}): {}", change.from, change.to, change.level, change.reason);
    metrics_->cap_changes.Add({{"kind", change.level}}).Increment();
  }
  ExportCap(cap);
}

void EngineLoop::ExportCap(int32_t cap) {
  metrics_->max_num_seqs.Set(cap);
  const ControllerStatus status = replica_.controller().status();
  metrics_->SetLevel(status.level.empty() ? ControllerModeName(replica_.controller().options().mode) : status.level);
  metrics_->SetRegime(status.regime);
}

bool EngineLoop::LaunchStep() {
  const TimePoint start = Clock::now();
  StepPlan plan;
  if (!spare_plans_.empty()) {
    plan = std::move(spare_plans_.back());
    spare_plans_.pop_back();
  }
  ReportCap(replica_.Plan(start, Seconds(start), plan));
  Dispatch(replica_.TakeEvents(), start);  // deadline ends, and the first event of those it starts
  if (plan.empty()) {
    spare_plans_.push_back(std::move(plan));
    Publish();
    return false;
  }
  try {
    workers_.Send(plan.step_id, plan);
  } catch (const WorkerLostError& e) {
    in_flight_.push_back(InFlight{std::move(plan), start});  // lost with the others
    OnWorkersLost(e);
    return false;
  } catch (const std::exception& e) {
    AbortAll(e, plan.step_id);
    return false;
  }
  const int32_t tokens = plan.num_scheduled_tokens();
  metrics_->scheduled_tokens.Increment(tokens);
  metrics_->steps.Increment();
  if (!plan.scheduled.empty()) {
    metrics_->step_sequences.Observe(static_cast<double>(plan.scheduled.size()));
    metrics_->step_tokens.Observe(static_cast<double>(tokens));
  }
  in_flight_.push_back(InFlight{std::move(plan), start});
  return true;
}

EngineLoop::InFlight EngineLoop::PopOldest() {
  InFlight step = std::move(in_flight_.front());
  in_flight_.erase(in_flight_.begin());
  return step;
}

void EngineLoop::CompleteStep() {
  InFlight step = PopOldest();
  try {
    workers_.Receive(output_);
    Refuse(output_.refused);
    replica_.Commit(step.plan, output_.sampled, output_.prompt_logprobs, events_);
  } catch (const WorkerLostError& e) {
    spare_plans_.push_back(std::move(step.plan));
    OnWorkersLost(e);
    return;
  } catch (const std::exception& e) {
    AbortAll(e, step.plan.step_id);
    return;
  }
  const TimePoint end = Clock::now();
  // The step's own time: from when the workers could start it (sent, or done
  // with the step before) to its samples. All three reads are this thread's, in order.
  const TimePoint began = std::max(step.sent, last_received_);
  last_step_s_ = std::chrono::duration<double>(end - began).count();
  last_received_ = end;
  replica_.StepRan(last_step_s_, step.plan.num_scheduled_tokens(), static_cast<int32_t>(step.plan.scheduled.size()));
  metrics_->step_seconds.Observe(last_step_s_);
  Dispatch(events_, end);
  spare_plans_.push_back(std::move(step.plan));
  Publish();
}

// The sequences the workers refused alone end now, each with its reason, before their step commits
// (which then finds them gone and reads no sample for them): the others in the step go on.
void EngineLoop::Refuse(const std::vector<SequenceError>& refused) {
  for (const SequenceError& e : refused) {
    if (!streams_.count(e.seq_id)) continue;  // ended since (cancelled, a deadline)
    spdlog::warn("seq {} refused by the workers: {}", e.seq_id, e.message);
    replica_.Cancel(e.seq_id);  // the workers forget it once the next plan's finished_ids names it
    Dispatch({SeqEvent{.seq_id = e.seq_id, .finish = FinishKind::kRefused, .error = e.message}}, Clock::now());
  }
}

// A worker failed a step or went away: every sequence ends aborted. The
// results of steps sent after it are read and dropped, so the stream's next
// result is the next step's (a closed stream fails those reads at once).
void EngineLoop::AbortAll(const std::exception& error, uint64_t step_id) {
  spdlog::error("step {} failed, aborting all sequences: {}", step_id, error.what());
  while (!in_flight_.empty()) {
    const InFlight step = PopOldest();
    try {
      workers_.Receive(output_);
    } catch (const std::exception& e) {
      spdlog::warn("step {} dropped: {}", step.plan.step_id, e.what());
    }
  }
  Dispatch(replica_.AbortAll(FinishKind::kAborted), Clock::now());
  Publish();
}

void EngineLoop::OnWorkersLost(const WorkerLostError& error) {
  const TimePoint now = Clock::now();
  for (InFlight& step : in_flight_) spare_plans_.push_back(std::move(step.plan));
  in_flight_.clear();
  const int32_t kept = replica_.RequeueAll();
  kept_ids_.clear();
  replica_.core().ForEachLive([this](uint64_t id) { kept_ids_.push_back(id); });
  spdlog::error("worker group lost ({}): {}; keeping {} requests for it, up to {:.0f} s", error.reason_name(),
                error.what(), kept, std::chrono::duration<double>(recovery_.recovery_timeout).count());
  metrics_->worker_losses.Add({{"reason", error.reason_name()}}).Increment();
  metrics_->recovering.Set(1);
  lost_ = true;
  down_ = false;
  lost_at_ = now;
  next_probe_ = now;
  next_waiting_log_ = now;  // the first answer says at once what the group is waiting for; then every 5 s
  last_step_s_ = 0;
  replica_.StepRan(0, 0, 0);  // no step to observe: the one committed last is not the new group's
  Publish();
}

void EngineLoop::CheckIdle() {
  try {
    workers_.CheckIdle();
  } catch (const WorkerLostError& e) {
    OnWorkersLost(e);
  }
}

TimePoint EngineLoop::NextRecoveryWake() const {
  // The timeout is a promise to the clients (end UNAVAILABLE then): woken for it, not at the
  // first probe after it (up to a probe interval and a probe late otherwise).
  return down_ ? next_probe_ : std::min(next_probe_, lost_at_ + recovery_.recovery_timeout);
}

void EngineLoop::EndPastRecoveryTimeout(TimePoint now) {
  if (down_ || now - lost_at_ < recovery_.recovery_timeout) return;
  const std::vector<SeqEvent> ended = replica_.AbortAll(FinishKind::kUnavailable);
  metrics_->requests_failed_by_loss.Increment(static_cast<double>(ended.size()));
  spdlog::error("worker group not back within {:.0f} s: {} requests end UNAVAILABLE, new ones are refused "
                "until it is", std::chrono::duration<double>(recovery_.recovery_timeout).count(), ended.size());
  Dispatch(ended, now);
  down_ = true;
  Publish();
}

void EngineLoop::Recover() {
  TimePoint now = Clock::now();
  replica_.ExpireDeadlines(now);
  Dispatch(replica_.TakeEvents(), now);
  EndPastRecoveryTimeout(now);
  if (now < next_probe_) return;
  const Reconnection back = workers_.Reconnect(recovery_.probe_timeout);
  now = Clock::now();
  next_probe_ = now + recovery_.probe_interval;
  if (back.back) return Resume(back, now);
  EndPastRecoveryTimeout(now);  // the timeout passed during the probe (up to probe_timeout)
  if (now >= next_waiting_log_) {
    spdlog::warn("waiting for the worker group ({:.0f} s): {}", std::chrono::duration<double>(now - lost_at_).count(),
                 back.detail);
    next_waiting_log_ = now + std::chrono::seconds(5);
  }
}

void EngineLoop::Resume(const Reconnection& back, TimePoint now) {
  int64_t resumed = 0;
  for (uint64_t id : kept_ids_) resumed += replica_.core().is_live(id) ? 1 : 0;
  kept_ids_.clear();
  for (int32_t rank : back.restarted_ranks) {
    metrics_->worker_restarts.Add({{"rank", std::to_string(rank)}}).Increment();
  }
  // A restarted rank holds only its --lora-modules: the adapters loaded at run time (served, or
  // retiring under requests kept) are read again by every rank (a no-op where a rank has them).
  for (const auto& [key, path] : lora_.RuntimeLoads()) {
    try {
      workers_.LoadLora(key, path);
    } catch (const std::exception& e) {  // its requests are refused by the workers, each alone
      spdlog::error("LoRA adapter {} could not be loaded again after the workers' restart: {}", key, e.what());
    }
  }
  const double took = std::chrono::duration<double>(now - lost_at_).count();
  metrics_->recovery_seconds.Observe(took);
  metrics_->requests_resumed.Increment(static_cast<double>(resumed));
  metrics_->recovering.Set(0);
  spdlog::info("worker group back after {:.2f} s ({}): resuming {} requests by recompute", took, back.detail, resumed);
  lost_ = false;
  down_ = false;
  last_received_ = now;
  Publish();
}

void EngineLoop::Dispatch(const std::vector<SeqEvent>& events, TimePoint now) {
  for (const SeqEvent& event : events) {
    auto it = streams_.find(event.seq_id);
    if (it == streams_.end()) continue;
    if (!event.new_tokens.empty() && !it->second.first_token) it->second.first_token = now;
    if (event.first_scheduled) it->second.num_cached_tokens = event.num_cached_tokens;
    // A few sessions carry every request: a linear look for the sink beats a set.
    if (std::find(touched_.begin(), touched_.end(), it->second.sink) == touched_.end()) {
      touched_.push_back(it->second.sink);
    }
    EventSink& sink = *it->second.sink;  // touched_ keeps it alive past End
    const uint64_t tag = it->second.tag;
    if (event.finish != FinishKind::kNone) End(event, now);
    sink.Deliver(tag, event);
  }
}

// Bookkeeping of a request's end, before its final event is visible to anyone:
// whoever sees the final event sees the request gone.
void EngineLoop::End(const SeqEvent& last, TimePoint now) {
  auto it = streams_.find(last.seq_id);
  if (it == streams_.end()) return;
  const Stream& stream = it->second;
  const FinishKind kind = last.finish;
  const bool served = kind == FinishKind::kLength || kind == FinishKind::kEos || kind == FinishKind::kStopToken ||
                      kind == FinishKind::kTimeout;
  if (served && stream.first_token) {
    // Arrival was read before the request entered the inbox, the first token after: never negative.
    replica_.Ended(last, Seconds(now), std::chrono::duration<double>(*stream.first_token - last.arrival).count(),
                   std::chrono::duration<double>(now - *stream.first_token).count(), stream.num_cached_tokens);
  }
  streams_.erase(it);
  num_live_.fetch_sub(1);
  metrics_->Finished(kind);
}

void EngineLoop::PublishLoraInfo() {
  replica_.core().LoraAdapters(lora_running_, lora_waiting_);
  // The core knows keys; the metric shows the names requests use (a reload's old and new weights
  // run under one name).
  for (auto* list : {&lora_running_, &lora_waiting_}) {
    for (std::string& key : *list) key = lora_.NameOf(key);
    std::sort(list->begin(), list->end());
    list->erase(std::unique(list->begin(), list->end()), list->end());
  }
  metrics_->SetLoraInfo(fmt::format("{}", fmt::join(lora_running_, ",")), fmt::format("{}", fmt::join(lora_waiting_, ",")),
                        replica_.core().config().max_loras);
}

void EngineLoop::Publish() {
  const double total = replica_.core().num_total_blocks(), free = replica_.core().num_free_blocks();
  if (replica_.core().config().max_loras > 0) PublishLoraInfo();
  metrics_->running.Set(replica_.core().num_running());
  metrics_->waiting.Set(replica_.core().num_waiting());
  metrics_->blocks_used.Set(total - free);
  metrics_->blocks_free.Set(free);
  metrics_->kv_usage.Set(total > 0 ? (total - free) / total : 0.0);
  metrics_->preemptions.Increment(static_cast<double>(replica_.core().num_preemptions() - preemptions_seen_));
  preemptions_seen_ = replica_.core().num_preemptions();
  metrics_->prefix_queries.Increment(static_cast<double>(replica_.core().num_prefix_cache_queries() - prefix_queries_seen_));
  prefix_queries_seen_ = replica_.core().num_prefix_cache_queries();
  metrics_->prefix_hits.Increment(static_cast<double>(replica_.core().num_prefix_cache_hits() - prefix_hits_seen_));
  prefix_hits_seen_ = replica_.core().num_prefix_cache_hits();

  const ControllerStatus status = replica_.controller().status();
  std::lock_guard lock(state_mu_);
  state_.max_num_seqs = replica_.controller().num_seqs();
  state_.controller_mode = ControllerModeName(status.mode);
  state_.load_level = status.level;
  state_.num_running = replica_.core().num_running();
  state_.num_waiting = replica_.core().num_waiting();
  state_.kv_cache_usage = total > 0 ? (total - free) / total : 0.0;
  state_.num_preemptions = replica_.core().num_preemptions();
  state_.prefix_cache_queries = replica_.core().num_prefix_cache_queries();
  state_.prefix_cache_hits = replica_.core().num_prefix_cache_hits();
  state_.num_cap_changes = status.num_changes;
  state_.num_cap_plans = status.num_plans;
  state_.cap_held = status.held;
  state_.workers_lost = lost_;
  // Copied only when it changed: a steady step allocates nothing.
  if (state_.running_lora_adapters != lora_running_) state_.running_lora_adapters = lora_running_;
}

}  // namespace ferry::scheduler
