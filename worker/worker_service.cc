#include "worker/worker_service.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <limits>
#include <random>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/metrics.h"
#include "proto/speculative.h"
#include "worker/comm/communicator.h"
#include "worker/engine/speculative_config.h"
#include "worker/engine/step_validation.h"
#include "worker/lora/lora_registry.h"

namespace ferry::worker {

struct WorkerMetrics {
  explicit WorkerMetrics(prometheus::Registry& r)
      : steps(prometheus::BuildCounter().Name("ferry_worker_steps_total")
                  .Help("Engine steps executed, by outcome").Register(r)),
        steps_ok(steps.Add({{"outcome", "ok"}})),
        steps_failed(steps.Add({{"outcome", "error"}})),
        step_seconds(prometheus::BuildHistogram().Name("ferry_worker_step_duration_seconds")
                         .Help("Time to execute one engine step").Register(r)
                         .Add({}, LatencyBucketsSeconds())),
        tokens(prometheus::BuildCounter().Name("ferry_worker_tokens_total")
                   .Help("Tokens computed (prompt and decode) and sampled").Register(r)),
        tokens_computed(tokens.Add({{"kind", "computed"}})),
        tokens_sampled(tokens.Add({{"kind", "sampled"}})),
        batch_size(prometheus::BuildHistogram().Name("ferry_worker_step_sequences")
                       .Help("Sequences in one engine step").Register(r)
                       .Add({}, prometheus::Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64, 128, 256})),
        spec(prometheus::BuildCounter().Name("ferry_worker_spec_decode_tokens_total")
                 .Help("Speculative decoding: sequence-steps that verified drafts (kind=drafts), draft tokens "
                       "verified (draft) and accepted (accepted). Acceptance rate: accepted / draft; tokens per "
                       "speculating step: (accepted + drafts) / drafts")
                 .Register(r)),
        spec_drafts(spec.Add({{"kind", "drafts"}})),
        spec_draft_tokens(spec.Add({{"kind", "draft"}})),
        spec_accepted_tokens(spec.Add({{"kind", "accepted"}})) {}
  prometheus::Family<prometheus::Counter>& steps;
  prometheus::Counter& steps_ok;
  prometheus::Counter& steps_failed;
  prometheus::Histogram& step_seconds;
  prometheus::Family<prometheus::Counter>& tokens;
  prometheus::Counter& tokens_computed;
  prometheus::Counter& tokens_sampled;
  prometheus::Histogram& batch_size;
  prometheus::Family<prometheus::Counter>& spec;
  prometheus::Counter& spec_drafts;
  prometheus::Counter& spec_draft_tokens;
  prometheus::Counter& spec_accepted_tokens;
};

namespace {

// Step requests from the stream's reader thread to the step thread.
class RequestQueue {
 public:
  void Push(ferry::v1::StepRequest request) {
    std::lock_guard lock(mutex_);
    requests_.push_back(std::move(request));
    changed_.notify_one();
  }
  void Close() {
    std::lock_guard lock(mutex_);
    closed_ = true;
    changed_.notify_one();
  }
  // The next request; waits for one. Empty once closed and drained.
  std::optional<ferry::v1::StepRequest> Pop() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return closed_ || !requests_.empty(); });
    return TakeLocked();
  }
  // The next request if one is there, else waits at most `wait` for one.
  std::optional<ferry::v1::StepRequest> PopWithin(std::chrono::microseconds wait) {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, wait, [&] { return closed_ || !requests_.empty(); });
    return TakeLocked();
  }

 private:
  std::optional<ferry::v1::StepRequest> TakeLocked() {
    if (requests_.empty()) return std::nullopt;
    std::optional<ferry::v1::StepRequest> next(std::move(requests_.front()));
    requests_.pop_front();
    return next;
  }
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<ferry::v1::StepRequest> requests_;
  bool closed_ = false;
};

uint64_t NewIncarnationId() {
  std::random_device device;
  std::uniform_int_distribution<uint64_t> draw(1, std::numeric_limits<uint64_t>::max());
  return draw(device);
}

}  // namespace

void StepWatch::Began(uint64_t step_id, Clock::time_point now) {
  std::lock_guard lock(mutex_);
  running_.push_back({step_id, now, num_began_ < kNumFirstSteps});
  ++num_began_;
}

void StepWatch::Ended() {
  std::lock_guard lock(mutex_);
  if (!running_.empty()) running_.pop_front();
}

void StepWatch::Broke(const std::string& reason) {
  std::lock_guard lock(mutex_);
  if (broken_.empty()) broken_ = reason;
}

double StepWatch::RunningSeconds(Clock::time_point now) const {
  std::lock_guard lock(mutex_);
  return running_.empty() ? 0.0 : std::chrono::duration<double>(now - running_.front().start).count();
}

std::string StepWatch::Problem(Clock::time_point now, int step_timeout_s) const {
  std::lock_guard lock(mutex_);
  if (!broken_.empty()) return broken_;
  if (step_timeout_s <= 0 || running_.empty()) return {};
  // The oldest step: one submitted behind it cannot start before it ends.
  const Running& r = running_.front();
  const double running_s = std::chrono::duration<double>(now - r.start).count();
  const int limit_s = r.first ? kFirstStepsFactor * step_timeout_s : step_timeout_s;
  if (running_s <= limit_s) return {};
  return fmt::format("step {} running for {:.1f} s, over {} s (--step-timeout-s {}{})", r.step_id, running_s,
                     limit_s, step_timeout_s, r.first ? ", 5x for the first steps" : "");
}

WorkerService::WorkerService(ModelRunner& runner, prometheus::Registry& registry, WorkerServiceOptions options)
    : incarnation_id_(NewIncarnationId()),
      runner_(runner),
      metrics_(std::make_unique<WorkerMetrics>(registry)),
      options_(std::move(options)) {}

WorkerService::~WorkerService() = default;

grpc::Status WorkerService::Info(grpc::ServerContext*, const ferry::v1::WorkerInfoRequest*,
                                 ferry::v1::WorkerInfo* out) {
  const ModelInfo& info = runner_.info();
  out->set_model(info.model);
  out->set_dtype(info.dtype);
  out->set_num_kv_blocks(info.num_kv_blocks);
  out->set_block_size(info.block_size);
  out->set_max_model_len(info.max_model_len);
  out->set_vocab_size(info.vocab_size);
  for (int32_t id : info.eos_token_ids) out->add_eos_token_ids(id);
  out->set_tp_rank(info.tp_rank);
  out->set_tp_size(info.tp_size);
  out->set_supports_prompt_logprobs(info.supports_prompt_logprobs);
  out->set_supports_guided_decoding(info.supports_guided_decoding);
  out->set_incarnation_id(incarnation_id_);
  const GenerationDefaults& d = info.generation_defaults;
  auto* defaults = out->mutable_generation_defaults();
  if (d.temperature) defaults->set_temperature(*d.temperature);
  if (d.top_p) defaults->set_top_p(*d.top_p);
  if (d.top_k) defaults->set_top_k(*d.top_k);
  if (d.min_p) defaults->set_min_p(*d.min_p);
  if (d.repetition_penalty) defaults->set_repetition_penalty(*d.repetition_penalty);
  out->mutable_speculative()->set_method(ToProto(info.speculative.method));
  out->mutable_speculative()->set_num_speculative_tokens(info.speculative.num_speculative_tokens);
  for (SpeculativeMethod m : info.speculative_methods) out->add_speculative_methods(ToProto(m));
  out->set_max_loras(info.max_loras);
  for (const std::string& name : runner_.LoraNames()) out->add_lora_names(name);  // thread-safe (model_runner.h)
  return grpc::Status::OK;
}

std::string WorkerService::HealthProblem() const {
  if (!runner_.healthy()) return "the engine reports a failure (see the worker's log)";
  return watch_.Problem(StepWatch::Clock::now(), options_.step_timeout_s);
}

grpc::Status WorkerService::Health(grpc::ServerContext*, const ferry::v1::HealthRequest*,
                                   ferry::v1::HealthResponse* out) {
  const std::string problem = HealthProblem();
  out->set_ok(problem.empty());
  out->set_incarnation_id(incarnation_id_);
  if (!out->ok()) out->set_reason(problem);
  out->set_step_running_s(watch_.RunningSeconds(StepWatch::Clock::now()));
  return grpc::Status::OK;
}

grpc::Status WorkerService::LoadLoraAdapter(grpc::ServerContext*, const ferry::v1::LoadLoraAdapterRequest* request,
                                            ferry::v1::LoraAdaptersResponse* out) {
  if (runner_.info().max_loras == 0) {
    return {grpc::StatusCode::FAILED_PRECONDITION, "this worker serves no LoRA adapters: start it with --enable-lora"};
  }
  try {
    runner_.LoadLora(request->lora_name(), request->lora_path());  // on this thread, beside the steps
  } catch (const LoraNameTaken& e) {
    return {grpc::StatusCode::ALREADY_EXISTS, e.what()};
  } catch (const std::invalid_argument& e) {
    return {grpc::StatusCode::INVALID_ARGUMENT, e.what()};
  }
  spdlog::info("LoRA adapter {} served from {}", request->lora_name(), request->lora_path());
  for (const std::string& name : runner_.LoraNames()) out->add_lora_names(name);
  return grpc::Status::OK;
}

grpc::Status WorkerService::UnloadLoraAdapter(grpc::ServerContext*, const ferry::v1::UnloadLoraAdapterRequest* request,
                                              ferry::v1::LoraAdaptersResponse* out) {
  if (runner_.info().max_loras == 0) {
    return {grpc::StatusCode::FAILED_PRECONDITION, "this worker serves no LoRA adapters: start it with --enable-lora"};
  }
  try {
    runner_.UnloadLora(request->lora_name());
  } catch (const std::invalid_argument& e) {  // "lora_name "x" is not loaded"
    return {grpc::StatusCode::NOT_FOUND, e.what()};
  }
  spdlog::info("LoRA adapter {} unloaded", request->lora_name());
  for (const std::string& name : runner_.LoraNames()) out->add_lora_names(name);
  return grpc::Status::OK;
}

namespace {

void ToTokenLogprob(const SampledTokenOut& s, ferry::v1::TokenLogprob* out) {
  out->set_token_id(s.token_id);
  out->set_logprob(s.logprob);
  out->set_rank(s.rank);
  for (const auto& [id, logprob] : s.top_logprobs) {
    auto* top = out->add_top();
    top->set_token_id(id);
    top->set_logprob(logprob);
  }
}

// No kind set: unconstrained (kNone). The gateway and the scheduler refuse json_object = false.
GuidedSpec ToGuidedSpec(const ferry::v1::GuidedDecoding& g) {
  GuidedSpec out;
  if (g.has_json_object()) out.kind = GuidedSpec::Kind::kJsonObject;
  if (g.has_choice()) {
    out.kind = GuidedSpec::Kind::kChoice;
    out.choices.assign(g.choice().choices().begin(), g.choice().choices().end());
  }
  if (g.has_json_schema()) out = GuidedSpec{GuidedSpec::Kind::kJsonSchema, {}, g.json_schema()};
  if (g.has_regex()) out = GuidedSpec{GuidedSpec::Kind::kRegex, {}, {}, g.regex()};
  if (g.has_grammar()) out = GuidedSpec{GuidedSpec::Kind::kGrammar, {}, {}, {}, g.grammar()};
  return out;
}

// The one place a wire SamplingParams becomes the engine's: the gateway's message, every optional
// field resolved (a field a direct client of the scheduler left unset takes sampling.proto's default).
SamplingOptions ToSamplingOptions(const ferry::v1::SamplingParams& p) {
  SamplingOptions o;
  o.temperature = p.temperature();
  o.top_p = p.has_top_p() ? p.top_p() : 1.f;
  o.top_k = p.top_k();
  o.min_p = p.min_p();
  o.presence_penalty = p.presence_penalty();
  o.frequency_penalty = p.frequency_penalty();
  o.repetition_penalty = p.has_repetition_penalty() ? p.repetition_penalty() : 1.f;
  o.logprobs = p.has_logprobs() ? p.logprobs() : -1;
  o.seed = p.seed();
  o.logit_bias.assign(p.logit_bias().begin(), p.logit_bias().end());
  o.allowed_token_ids.assign(p.allowed_token_ids().begin(), p.allowed_token_ids().end());
  o.min_tokens = p.min_tokens();
  o.guided = ToGuidedSpec(p.guided());
  return o;
}

}  // namespace

StepSpec ToStepSpec(const ferry::v1::StepRequest& request) {
  StepSpec spec;
  for (const auto& n : request.new_sequences()) {
    NewSequenceSpec s;
    s.seq_id = n.seq_id();
    s.token_ids.assign(n.token_ids().begin(), n.token_ids().end());
    s.num_generated = n.num_generated();
    s.num_cached_tokens = n.num_cached_tokens();
    s.sampling = ToSamplingOptions(n.sampling());
    s.sampling.min_tokens_suppressed_ids.assign(n.min_tokens_suppressed_ids().begin(),
                                                n.min_tokens_suppressed_ids().end());
    s.prompt_logprobs = n.sampling().has_prompt_logprobs() ? n.sampling().prompt_logprobs() : -1;
    const std::optional<SpeculativeMethod> method = FromProto(n.speculative().method());
    if (!method) {
      throw std::invalid_argument("sequence " + std::to_string(n.seq_id()) + ": speculative method " +
                                  std::to_string(n.speculative().method()) + " is not a SpeculativeMethod");
    }
    s.speculative = *method == SpeculativeMethod::kDefault ? SpeculativeMethod::kNone : *method;
    s.lora_name = n.lora_name();
    spec.new_sequences.push_back(std::move(s));
  }
  for (const auto& s : request.scheduled()) {
    spec.scheduled.push_back({s.seq_id(), s.num_tokens(),
                              std::vector<int32_t>(s.new_block_ids().begin(), s.new_block_ids().end()),
                              s.num_lookahead_tokens()});
  }
  spec.finished_ids.assign(request.finished_ids().begin(), request.finished_ids().end());
  spec.preempted_ids.assign(request.preempted_ids().begin(), request.preempted_ids().end());
  return spec;
}

StepWatch::Clock::time_point WorkerService::Began(uint64_t step_id) {
  const auto start = StepWatch::Clock::now();
  watch_.Began(step_id, start);
  if (options_.device && num_outstanding_++ == 0) options_.device->StepBegan();
  return start;
}

void WorkerService::Ended(StepWatch::Clock::time_point start, ferry::v1::StepResult* result) {
  if (options_.device && --num_outstanding_ == 0) options_.device->StepEnded();
  watch_.Ended();
  // A step submitted behind another (overlap) starts running when that one ends: its execute
  // time counts from then, so step times add up to the engine's busy time, not more, and the
  // scheduler's step-time figures mean the same with and without overlap.
  const auto now = StepWatch::Clock::now();
  const auto began = std::max(start, last_step_end_);
  last_step_end_ = now;
  const double seconds = std::chrono::duration<double>(now - began).count();
  result->set_execute_s(seconds);
  metrics_->step_seconds.Observe(seconds);
}

void WorkerService::Answer(const StepSpec& spec, const std::vector<SampledTokenOut>& samples,
                           ferry::v1::StepResult* result) {
  for (const SampledTokenOut& s : samples) {
    auto* out = result->add_sampled();
    out->set_seq_id(s.seq_id);
    out->set_token_id(s.token_id);
    if (s.has_logprobs) ToTokenLogprob(s, out->mutable_logprob());
  }
  for (const PromptLogprobsOut& p : runner_.TakePromptLogprobs()) {
    auto* out = result->add_prompt_logprobs();
    out->set_seq_id(p.seq_id);
    out->set_first_index(p.first_index);
    for (const SampledTokenOut& t : p.tokens) ToTokenLogprob(t, out->add_logprobs());
  }
  int64_t computed = 0;
  for (const auto& s : spec.scheduled) computed += s.num_tokens;
  metrics_->tokens_computed.Increment(static_cast<double>(computed));
  metrics_->tokens_sampled.Increment(result->sampled_size());
  const SpeculationCounts spec_counts = runner_.TakeSpeculationCounts();
  metrics_->spec_drafts.Increment(static_cast<double>(spec_counts.num_drafts));
  metrics_->spec_draft_tokens.Increment(static_cast<double>(spec_counts.num_draft_tokens));
  metrics_->spec_accepted_tokens.Increment(static_cast<double>(spec_counts.num_accepted_tokens));
  if (!spec.scheduled.empty()) metrics_->batch_size.Observe(static_cast<double>(spec.scheduled.size()));
  metrics_->steps_ok.Increment();
}

std::string WorkerService::Failed(uint64_t step_id, const std::exception& e) {
  metrics_->steps_failed.Increment();
  if (dynamic_cast<const CommError*>(&e) != nullptr) return OnGroupFailure(step_id, e);
  // The runner leaves its state unchanged on a bad spec; the scheduler aborts the step's
  // sequences and carries on.
  spdlog::error("step {} failed: {}", step_id, e.what());
  return e.what();
}

void WorkerService::Screen(StepSpec& spec, google::protobuf::RepeatedPtrField<ferry::v1::SequenceError>* errors) {
  const auto gone = [&](uint64_t id) { return refused_.count(id) > 0; };
  if (!refused_.empty()) {  // refused in an earlier step: no mention of them reaches the runner
    std::erase_if(spec.scheduled, [&](const ScheduledSpec& s) { return gone(s.seq_id); });
    std::erase_if(spec.preempted_ids, gone);
    std::erase_if(spec.finished_ids, [&](uint64_t id) { return refused_.erase(id) > 0; });
  }
  const size_t before = refused_.size();
  std::erase_if(spec.new_sequences, [&](const NewSequenceSpec& n) {
    try {
      ValidateNewSequence(n, runner_.info());
      return false;
    } catch (const std::invalid_argument& e) {
      spdlog::warn("refused: {}", e.what());
      ferry::v1::SequenceError* error = errors->Add();
      error->set_seq_id(n.seq_id);
      error->set_message(e.what());
      refused_.insert(n.seq_id);
      return true;
    }
  });
  if (refused_.size() > before) std::erase_if(spec.scheduled, [&](const ScheduledSpec& s) { return gone(s.seq_id); });
}

ferry::v1::StepResult WorkerService::Execute(const ferry::v1::StepRequest& request) {
  ferry::v1::StepResult result;
  result.set_step_id(request.step_id());
  const auto start = Began(request.step_id());
  try {
    StepSpec spec = ToStepSpec(request);
    Screen(spec, result.mutable_sequence_errors());
    Answer(spec, runner_.Step(spec), &result);
  } catch (const std::exception& e) {
    result.set_error(Failed(request.step_id(), e));
  }
  Ended(start, &result);
  return result;
}

// A step submitted to an overlapping runner, answered once collected.
struct WorkerService::Submitted {
  uint64_t step_id = 0;
  StepSpec spec;
  StepWatch::Clock::time_point start;
  std::optional<std::string> error;  // Submit failed: the answer, without Collect
  google::protobuf::RepeatedPtrField<ferry::v1::SequenceError> refused;  // Screen's, for the answer
};

WorkerService::Submitted WorkerService::Submit(const ferry::v1::StepRequest& request) {
  Submitted s{request.step_id(), {}, Began(request.step_id()), std::nullopt};
  try {
    s.spec = ToStepSpec(request);
    Screen(s.spec, &s.refused);
    runner_.Submit(s.spec);
  } catch (const std::exception& e) {
    s.error = Failed(request.step_id(), e);
  }
  return s;
}

ferry::v1::StepResult WorkerService::Collect(Submitted& s) {
  ferry::v1::StepResult result;
  result.set_step_id(s.step_id);
  result.mutable_sequence_errors()->Swap(&s.refused);
  if (s.error) {
    result.set_error(*s.error);
  } else {
    try {
      Answer(s.spec, runner_.Collect(), &result);
    } catch (const std::exception& e) {
      result.set_error(Failed(s.step_id, e));
    }
  }
  Ended(s.start, &result);
  return result;
}

// With an overlapping runner: a reader thread takes requests off the stream as they come, and
// this thread submits each one as soon as it is there and the runner has room (the host work of
// step N+1 then overlaps the device running step N: the scheduler's async scheduling sends N+1
// before N's answer), and answers the oldest in order once it is done (polled, so a request that
// arrives meanwhile is still submitted first). Every submitted step is collected, even after the
// scheduler went away, so the runner never holds a step when the next stream starts.
void WorkerService::RunOverlapped(
    grpc::ServerContext* context, grpc::ServerReaderWriter<ferry::v1::StepResult, ferry::v1::StepRequest>* stream) {
  constexpr auto kPoll = std::chrono::microseconds(20);
  RequestQueue queue;
  std::thread reader([&] {
    ferry::v1::StepRequest request;
    while (stream->Read(&request)) queue.Push(std::move(request));
    queue.Close();
  });
  std::deque<Submitted> submitted;
  bool answering = true;  // false once a write failed: the scheduler is gone
  const auto room = [&] { return submitted.size() < static_cast<size_t>(ModelRunner::kMaxSubmittedSteps); };
  for (;;) {
    std::optional<ferry::v1::StepRequest> next;
    bool oldest_done = false;
    if (submitted.empty()) {
      next = queue.Pop();
      if (!next) break;  // the stream ended and every step is answered
    } else {
      oldest_done = submitted.front().error || runner_.Ready();
      // Submitting comes first: the device gets step N+1 before the host answers step N.
      if (room()) next = queue.PopWithin(oldest_done ? std::chrono::microseconds(0) : kPoll);
    }
    if (next) {
      if (answering) submitted.push_back(Submit(*next));
      continue;  // a request that came after the scheduler went away is dropped
    }
    if (!oldest_done && room()) continue;  // neither a new request nor a finished step yet
    const ferry::v1::StepResult result = Collect(submitted.front());
    submitted.pop_front();
    if (answering && !stream->Write(result)) {
      answering = false;
      context->TryCancel();  // ends the reader's Read
    }
  }
  reader.join();
}

// A rank whose collective failed cannot take part in another: its peers' pairs and tags no
// longer match (worker/comm/README.md). Limping on would fail every later step, so the worker
// reports the broken group and hands over to the hook (ferry-worker exits, code 3).
std::string WorkerService::OnGroupFailure(uint64_t step_id, const std::exception& e) {
  const std::string reason = fmt::format("tensor-parallel rank {} of {} lost its group in step {}: {}",
                                         runner_.info().tp_rank, runner_.info().tp_size, step_id, e.what());
  spdlog::critical("{}", reason);
  watch_.Broke(reason);
  if (options_.on_group_failure) options_.on_group_failure(reason);
  return reason;
}

grpc::Status WorkerService::Step(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<ferry::v1::StepResult, ferry::v1::StepRequest>* stream) {
  std::lock_guard lock(step_mutex_);
  // One scheduler drives this worker; a new stream is a new (or restarted) scheduler, whose
  // sequence ids may collide with the old stream's. Start from nothing.
  runner_.ForgetAll();
  refused_.clear();
  spdlog::info("scheduler connected from {}", context->peer());
  if (runner_.supports_overlap()) {
    RunOverlapped(context, stream);
  } else {
    ferry::v1::StepRequest request;
    while (stream->Read(&request)) {
      if (!stream->Write(Execute(request))) break;
    }
  }
  spdlog::info("scheduler stream from {} closed", context->peer());
  return grpc::Status::OK;
}

}  // namespace ferry::worker
