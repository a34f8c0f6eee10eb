#include "scheduler/scheduler_service.h"

#include <algorithm>

#include <spdlog/spdlog.h>

namespace ferry::scheduler {

namespace {

RequestSpec ToRequestSpec(const ferry::v1::SubmitRequest& r, const std::vector<int32_t>& eos_ids) {
  RequestSpec spec;
  spec.request_id = r.request_id();
  spec.prompt.assign(r.prompt_token_ids().begin(), r.prompt_token_ids().end());
  spec.max_tokens = r.max_tokens();
  SamplingParams& p = spec.sampling;
  p.temperature = r.temperature();
  p.top_p = r.top_p() > 0 ? r.top_p() : 1.f;
  p.top_k = r.top_k();
  p.min_p = r.min_p();
  p.presence_penalty = r.presence_penalty();
  p.frequency_penalty = r.frequency_penalty();
  p.repetition_penalty = r.repetition_penalty() > 0 ? r.repetition_penalty() : 1.f;
  p.logprobs = r.logprobs();
  p.seed = r.seed();
  spec.stop_token_ids.assign(r.stop_token_ids().begin(), r.stop_token_ids().end());
  spec.eos_token_ids = eos_ids;
  spec.ignore_eos = r.ignore_eos();
  spec.priority = r.priority();
  spec.lane = r.lane();
  spec.arrival = Clock::now();
  return spec;
}

// The client's gRPC deadline (propagated by the gateway) as a steady-clock time.
TimePoint SteadyDeadline(const grpc::ServerContext& context) {
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

grpc::Status SchedulerService::Submit(grpc::ServerContext* context, const ferry::v1::SubmitRequest* request,
                                      grpc::ServerWriter<ferry::v1::TokenEvent>* writer) {
  const std::vector<int32_t> eos(info_.eos_token_ids().begin(), info_.eos_token_ids().end());
  const auto arrival = Clock::now();
  uint64_t seq_id = 0;
  std::shared_ptr<RequestChannel> channel;
  try {
    RequestSpec spec = ToRequestSpec(*request, eos);
    spec.deadline = SteadyDeadline(*context);
    const TimePoint queue_deadline = request->queue_timeout_ms() > 0
                                         ? arrival + std::chrono::milliseconds(request->queue_timeout_ms())
                                         : TimePoint::max();
    std::tie(seq_id, channel) = loop_.Submit(std::move(spec), queue_deadline);
  } catch (const std::invalid_argument& e) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, e.what());
  }
  spdlog::debug("req={} seq={} queued ({} prompt tokens)", request->request_id(), seq_id,
                request->prompt_token_ids_size());
  bool first = true;
  while (true) {
    // Short waits so a cancelled call is noticed well within one step.
    auto event = channel->Pop(std::chrono::milliseconds(5));
    if (!event) {
      if (context->IsCancelled()) {
        loop_.Cancel(seq_id);
        spdlog::debug("req={} seq={} cancelled by client", request->request_id(), seq_id);
        return grpc::Status::CANCELLED;
      }
      continue;
    }
    if (event->finish == FinishKind::kCancelled) return grpc::Status::CANCELLED;
    if (event->finish == FinishKind::kDeadlineExceeded) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          "the request was not started within its deadline or its lane's queue timeout");
    }
    if (event->finish == FinishKind::kAborted) {
      return grpc::Status(grpc::StatusCode::ABORTED, "the engine failed this request");
    }
    ferry::v1::TokenEvent out;
    out.mutable_token_ids()->Add(event->new_tokens.begin(), event->new_tokens.end());
    for (size_t i = 0; i < event->logprobs.size() && i < event->new_tokens.size(); ++i) {
      auto* lp = out.add_logprobs();
      lp->set_token_id(event->new_tokens[i]);
      lp->set_logprob(event->logprobs[i].logprob);
      for (const auto& [id, logprob] : event->logprobs[i].top) {
        auto* top = lp->add_top();
        top->set_token_id(id);
        top->set_logprob(logprob);
      }
    }
    out.set_finish(ToProto(event->finish));
    if (first) {
      const auto started = channel->started().value_or(Clock::now());
      // Clamped: `started` is read on the engine thread, `arrival` here, and on this VM one core's
      // clock read can lag another's by a few ms (a negative queue time was seen in CI).
      out.set_queue_s(std::max(0.0, std::chrono::duration<double>(started - arrival).count()));
      first = false;
    }
    if (!writer->Write(out)) {
      loop_.Cancel(seq_id);
      return grpc::Status::CANCELLED;
    }
    if (event->finish != FinishKind::kNone) {
      spdlog::debug("req={} seq={} finished", request->request_id(), seq_id);
      return grpc::Status::OK;
    }
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
