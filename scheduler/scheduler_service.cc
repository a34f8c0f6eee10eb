#include "scheduler/scheduler_service.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>

#include <spdlog/spdlog.h>

#include "structured/ebnf_grammar.h"
#include "structured/json_schema.h"
#include "structured/regex_dfa.h"

namespace ferry::scheduler {

namespace {

// The one place a wire SamplingParams becomes the scheduler's: what the planner reads, and the
// message itself to carry to the workers.
SamplingParams ToSamplingParams(const ferry::v1::SamplingParams& s) {
  return SamplingParams{.min_tokens = s.min_tokens(),
                        .prompt_logprobs = s.has_prompt_logprobs() ? s.prompt_logprobs() : -1,
                        .encoded = s.SerializeAsString()};
}

RequestSpec ToRequestSpec(const ferry::v1::SubmitRequest& r, const std::vector<int32_t>& eos_ids) {
  RequestSpec spec;
  spec.request_id = r.request_id();
  spec.prompt.assign(r.prompt_token_ids().begin(), r.prompt_token_ids().end());
  const ferry::v1::SamplingParams& s = r.sampling();
  spec.max_tokens = s.max_tokens();
  spec.sampling = ToSamplingParams(s);
  spec.stop_token_ids.assign(s.stop_token_ids().begin(), s.stop_token_ids().end());
  spec.eos_token_ids = eos_ids;
  spec.ignore_eos = s.ignore_eos();
  SamplingParams& p = spec.sampling;
  if (p.min_tokens > 0) {
    if (!spec.ignore_eos) p.min_tokens_suppressed_ids = eos_ids;
    p.min_tokens_suppressed_ids.insert(p.min_tokens_suppressed_ids.end(), spec.stop_token_ids.begin(),
                                       spec.stop_token_ids.end());
  }
  spec.priority = r.priority();
  spec.lane = r.lane();
  return spec;
}

// The client's gRPC deadline (propagated by the gateway) as a steady-clock time.
TimePoint SteadyDeadline(const grpc::ServerContextBase& context) {
  const auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return TimePoint::max();
  const auto left = deadline - std::chrono::system_clock::now();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(left);
}

void ToProto(const LoopState& s, ferry::v1::SchedulerState* out) {
  out->set_max_num_seqs(s.max_num_seqs);
  out->set_controller_mode(s.controller_mode);
  out->set_load_level(s.load_level);
  out->set_num_running(s.num_running);
  out->set_num_waiting(s.num_waiting);
  out->set_kv_cache_usage(s.kv_cache_usage);
  out->set_num_preemptions(s.num_preemptions);
  out->set_prefix_cache_queries(s.prefix_cache_queries);
  out->set_prefix_cache_hits(s.prefix_cache_hits);
  out->set_num_cap_changes(s.num_cap_changes);
}

ferry::v1::FinishKind ToProto(FinishKind kind) {
  switch (kind) {
    case FinishKind::kNone: return ferry::v1::FINISH_KIND_NONE;
    case FinishKind::kLength: return ferry::v1::FINISH_KIND_LENGTH;
    case FinishKind::kEos: return ferry::v1::FINISH_KIND_EOS;
    case FinishKind::kStopToken: return ferry::v1::FINISH_KIND_STOP_TOKEN;
    case FinishKind::kTimeout: return ferry::v1::FINISH_KIND_TIMEOUT;
    default: return ferry::v1::FINISH_KIND_ABORTED;
  }
  return ferry::v1::FINISH_KIND_ABORTED;
}

}  // namespace

grpc::Status SchedulerService::Info(grpc::ServerContext*, const ferry::v1::SchedulerInfoRequest*,
                                    ferry::v1::SchedulerInfo* out) {
  *out = info_;
  return grpc::Status::OK;
}

namespace {

void ToProto(const TokenLogprob& in, int32_t token_id, ferry::v1::TokenLogprob* out) {
  out->set_token_id(token_id);
  out->set_logprob(in.logprob);
  if (in.rank > 0) out->set_rank(in.rank);
  for (const auto& [id, logprob] : in.top) {
    auto* top = out->add_top();
    top->set_token_id(id);
    top->set_logprob(logprob);
  }
}

// A bad value would fail the worker's whole step, every sequence in it with it.
void CheckPromptLogprobs(const ferry::v1::SubmitRequest& r, const ferry::v1::SchedulerInfo& info) {
  const ferry::v1::SamplingParams& s = r.sampling();
  if (!s.has_prompt_logprobs()) return;
  if (s.prompt_logprobs() < 0 || s.prompt_logprobs() > 20) {
    throw std::invalid_argument(fmt::format("prompt_logprobs = {} must be in [0, 20]", s.prompt_logprobs()));
  }
  if (!info.supports_prompt_logprobs()) {
    throw std::invalid_argument("prompt_logprobs is not supported by this replica's worker backend");
  }
}

// Refused here rather than by the worker, whose refusal would fail every sequence in its step.
// The gateway has checked the choices, the schema and the regex; an empty list would leave the
// worker nothing to match, and a schema or a regex is compiled again since a client may call the
// scheduler directly.
void CheckGuided(const ferry::v1::SubmitRequest& r, const ferry::v1::SchedulerInfo& info) {
  const ferry::v1::GuidedDecoding& g = r.sampling().guided();
  if (g.kind_case() == ferry::v1::GuidedDecoding::KIND_NOT_SET) return;
  if (!info.supports_guided_decoding()) {
    throw std::invalid_argument("guided decoding is not supported by this replica's worker backend");
  }
  if (g.has_json_object() && !g.json_object()) {
    throw std::invalid_argument("guided.json_object = false must be true when set");
  }
  if (g.has_choice() && g.choice().choices_size() == 0) {
    throw std::invalid_argument("guided.choice.choices (count) = 0 must be at least 1");
  }
  if (g.has_json_schema()) {
    try {
      CompileJsonSchemaCached(g.json_schema());
    } catch (const JsonSchemaError& e) {
      throw std::invalid_argument(std::string("guided.json_schema: ") + e.what());
    }
  }
  if (g.has_regex()) {
    try {
      CompileRegexCached(g.regex());
    } catch (const RegexError& e) {
      throw std::invalid_argument(std::string("guided.regex: ") + e.what());
    }
  }
  if (g.has_grammar()) {
    try {
      CheckGrammarCached(g.grammar());
    } catch (const GrammarError& e) {
      throw std::invalid_argument(std::string("guided.grammar: ") + e.what());
    }
  }
}

ferry::v1::TokenEvent ToTokenEvent(const SeqEvent& event) {
  ferry::v1::TokenEvent out;
  out.mutable_token_ids()->Add(event.new_tokens.begin(), event.new_tokens.end());
  for (size_t i = 0; i < event.logprobs.size() && i < event.new_tokens.size(); ++i) {
    ToProto(event.logprobs[i], event.new_tokens[i], out.add_logprobs());
  }
  for (const TokenLogprob& lp : event.prompt_logprobs) ToProto(lp, lp.token_id, out.add_prompt_logprobs());
  out.set_finish(ToProto(event.finish));
  return out;
}

// The status that ends a call for an event the loop ends it with, if it carries no tokens to send.
std::optional<grpc::Status> EndStatus(FinishKind finish) {
  switch (finish) {
    case FinishKind::kCancelled: return grpc::Status::CANCELLED;
    case FinishKind::kDeadlineExceeded:
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          "the request was not started within its deadline or its lane's queue timeout");
    case FinishKind::kAborted: return grpc::Status(grpc::StatusCode::ABORTED, "the engine failed this request");
    default: return std::nullopt;
  }
}

// One Submit call as a gRPC callback reactor: no thread waits on it. The engine loop's push
// to the request's channel starts a write when none is in flight; each finished write starts
// the next with whatever queued meanwhile (merged). A cancelled call cancels the sequence.
//
// Lifetime: gRPC deletes nothing; OnDone deletes the reactor. The loop reaches it only through
// `link_`, whose lock OnDone takes to cut the link, so OnDone waits for a push in progress. A
// reaction may run inline on the pushing thread (inside StartWrite), hence a recursive lock;
// nothing here touches the reactor after calling Finish or StartWriteAndFinish.
class SubmitReactor final : public grpc::ServerWriteReactor<ferry::v1::TokenEvent> {
 public:
  SubmitReactor(EngineLoop& loop, std::shared_ptr<RequestChannel> channel, uint64_t seq_id, TimePoint arrival)
      : loop_(loop), channel_(std::move(channel)), seq_id_(seq_id), arrival_(arrival),
        link_(std::make_shared<Link>()) {
    link_->reactor = this;
    channel_->SetListener([link = link_] {
      std::lock_guard lock(link->mu);
      if (link->reactor != nullptr) link->reactor->WriteNext();
    });
  }

  void OnWriteDone(bool ok) override {
    bool went_away = false, cancelled = false;
    {
      std::lock_guard lock(mu_);
      writing_ = false;
      // Only OnCancel sets done_ while a StartWrite is out (a last write uses
      // StartWriteAndFinish, which has no OnWriteDone): it left the Finish to us.
      cancelled = done_;
      went_away = !ok && !done_;  // the client went away mid-write
      done_ = done_ || went_away;
    }
    if (went_away) loop_.Cancel(seq_id_);
    if (went_away || cancelled) return Finish(grpc::Status::CANCELLED);
    WriteNext();
  }

  void OnCancel() override {
    loop_.Cancel(seq_id_);
    bool finish = false;
    {
      std::lock_guard lock(mu_);
      if (done_) return;
      done_ = true;
      finish = !writing_;  // else OnWriteDone follows and finishes
    }
    if (finish) Finish(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    {
      std::lock_guard lock(link_->mu);
      link_->reactor = nullptr;
    }
    delete this;
  }

  // Starts the next write if none is in flight and events are queued.
  void WriteNext() {
    std::optional<grpc::Status> end;
    bool last = false;
    {
      std::lock_guard lock(mu_);
      if (writing_ || done_) return;
      auto event = channel_->TryPop();
      if (!event) return;
      end = EndStatus(event->finish);
      last = end.has_value() || event->finish != FinishKind::kNone;
      done_ = last;
      if (!end) {
        out_ = ToTokenEvent(*event);
        if (first_) {
          const auto started = event->first_scheduled.value_or(Clock::now());
          // Clamped: `started` is read on the engine thread, `arrival` on another, and on this
          // VM one core's clock can lag another's by a few ms.
          out_.set_queue_s(std::max(0.0, std::chrono::duration<double>(started - arrival_).count()));
          out_.set_num_cached_tokens(event->num_cached_tokens);
          first_ = false;
        }
        writing_ = true;
      }
    }
    if (end) return Finish(*end);
    if (last) return StartWriteAndFinish(&out_, grpc::WriteOptions(), grpc::Status::OK);
    StartWrite(&out_);
  }

 private:
  struct Link {
    std::recursive_mutex mu;
    SubmitReactor* reactor = nullptr;
  };

  EngineLoop& loop_;
  const std::shared_ptr<RequestChannel> channel_;
  const uint64_t seq_id_;
  const TimePoint arrival_;
  const std::shared_ptr<Link> link_;
  std::mutex mu_;
  bool writing_ = false;         // a StartWrite awaits its OnWriteDone
  bool done_ = false;            // Finish was called, or will be when the write in flight ends
  bool first_ = true;
  ferry::v1::TokenEvent out_;    // the message in flight (gRPC reads it until OnWriteDone)
};

// A call refused before it reached the loop.
class RefusedReactor final : public grpc::ServerWriteReactor<ferry::v1::TokenEvent> {
 public:
  explicit RefusedReactor(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerWriteReactor<ferry::v1::TokenEvent>* SchedulerService::Submit(grpc::CallbackServerContext* context,
                                                                          const ferry::v1::SubmitRequest* request) {
  const std::vector<int32_t> eos(info_.eos_token_ids().begin(), info_.eos_token_ids().end());
  const auto arrival = Clock::now();
  try {
    CheckPromptLogprobs(*request, info_);
    CheckGuided(*request, info_);
    RequestSpec spec = ToRequestSpec(*request, eos);
    spec.arrival = arrival;  // one reading for the core (TTFT, aging, queue deadline) and queue_s
    spec.deadline = SteadyDeadline(*context);
    if (request->queue_timeout_ms() > 0) {
      spec.queue_deadline = arrival + std::chrono::milliseconds(request->queue_timeout_ms());
    }
    auto [seq_id, channel] = loop_.Submit(std::move(spec));
    spdlog::debug("req={} seq={} queued ({} prompt tokens)", request->request_id(), seq_id,
                  request->prompt_token_ids_size());
    return new SubmitReactor(loop_, std::move(channel), seq_id, arrival);
  } catch (const std::invalid_argument& e) {
    return new RefusedReactor(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, e.what()));
  }
}

grpc::Status SchedulerService::GetState(grpc::ServerContext*, const ferry::v1::GetStateRequest*,
                                        ferry::v1::SchedulerState* out) {
  ToProto(loop_.State(), out);
  return grpc::Status::OK;
}

grpc::Status SchedulerService::SetMaxNumSeqs(grpc::ServerContext*, const ferry::v1::SetMaxNumSeqsRequest* request,
                                             ferry::v1::SchedulerState* out) {
  if (request->max_num_seqs() <= 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "max_num_seqs = " + std::to_string(request->max_num_seqs()) + " must be > 0");
  }
  spdlog::info("admin: max_num_seqs set to {}", request->max_num_seqs());
  ToProto(loop_.SetMaxNumSeqs(request->max_num_seqs()), out);
  return grpc::Status::OK;
}

}  // namespace ferry::scheduler
