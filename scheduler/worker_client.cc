#include "scheduler/worker_client.h"

#include <algorithm>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "proto/speculative.h"
#include <spdlog/spdlog.h>

namespace ferry::scheduler {

// A worker reads an adapter in well under a second; a minute covers a slow disk.
constexpr std::chrono::seconds kLoraCallTimeout(60);

struct GrpcWorkerGroup::Rank {
  std::string address;
  std::unique_ptr<ferry::v1::Worker::Stub> stub;
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientReaderWriter<ferry::v1::StepRequest, ferry::v1::StepResult>> stream;
  ferry::v1::StepResult result;  // Receive's, reused: parsing clears it and keeps its elements
};

GrpcWorkerGroup::GrpcWorkerGroup(std::vector<std::string> addresses, StepTimeouts timeouts, const TlsFlags& tls)
    : timeouts_(timeouts) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  for (auto& address : addresses) {
    auto rank = std::make_unique<Rank>();
    rank->address = address;
    rank->stub = ferry::v1::Worker::NewStub(InternalChannel(address, tls, args));
    ranks_.push_back(std::move(rank));
  }
  incarnations_.assign(ranks_.size(), 0);
  pending_.reserve(8);
  watchdog_ = std::thread([this] { Watch(); });
}

GrpcWorkerGroup::~GrpcWorkerGroup() {
  {
    std::lock_guard lock(watch_mu_);
    stopping_ = true;
  }
  watch_cv_.notify_one();
  watchdog_.join();
  CloseStreams();
}

// Sleeps until the oldest step in flight is due; past it, cancels every stream (Receive's read
// then fails and names the rank it waited for). A step is due its timeout after it could begin:
// when it was sent, or when the step before it was done, whichever is later.
void GrpcWorkerGroup::Watch() {
  std::unique_lock lock(watch_mu_);
  while (!stopping_) {
    if (pending_.empty() || timed_out_) {
      watch_cv_.wait(lock);
      continue;
    }
    const Pending& oldest = pending_.front();
    const auto limit = oldest.first ? timeouts_.first_steps : timeouts_.step;
    const auto due = std::max(oldest.sent, last_done_) + limit;
    if (std::chrono::steady_clock::now() < due) {
      watch_cv_.wait_until(lock, due);  // woken early by a new step, or spuriously: look again
      continue;
    }
    timed_out_ = true;
    timeout_what_ = fmt::format("rank {} ({}) did not finish step {} within {} s", reading_rank_,
                                ranks_[reading_rank_]->address, oldest.step_id,
                                std::chrono::duration<double>(limit).count());
    for (auto& rank : ranks_) {
      if (rank->context) rank->context->TryCancel();
    }
  }
}

std::vector<bool> GrpcWorkerGroup::HealthyRanks(std::chrono::milliseconds timeout) const {
  std::vector<bool> out;
  for (const auto& rank : ranks_) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + timeout);
    ferry::v1::HealthResponse response;
    out.push_back(rank->stub->Health(&context, {}, &response).ok() && response.ok());
  }
  return out;
}

void GrpcWorkerGroup::LoadLora(const std::string& key, const std::string& path) {
  ferry::v1::LoadLoraAdapterRequest request;
  request.set_lora_name(key);
  request.set_lora_path(path);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kLoraCallTimeout);
    ferry::v1::LoraAdaptersResponse response;
    const grpc::Status status = ranks_[r]->stub->LoadLoraAdapter(&context, request, &response);
    if (status.ok()) continue;
    for (size_t done = 0; done < r; ++done) {  // all ranks or none keep it
      grpc::ClientContext undo;
      undo.set_deadline(std::chrono::system_clock::now() + kLoraCallTimeout);
      ferry::v1::UnloadLoraAdapterRequest unload;
      unload.set_lora_name(key);
      (void)ranks_[done]->stub->UnloadLoraAdapter(&undo, unload, &response);
    }
    const std::string what = fmt::format("worker {}: {}", ranks_[r]->address, status.error_message());
    switch (status.error_code()) {
      case grpc::StatusCode::INVALID_ARGUMENT:
      case grpc::StatusCode::ALREADY_EXISTS:
      case grpc::StatusCode::FAILED_PRECONDITION:
        throw std::invalid_argument(status.error_message());  // the adapter's fault: the same on every rank
      default:
        throw std::runtime_error(what);
    }
  }
}

void GrpcWorkerGroup::UnloadLora(const std::string& key) {
  ferry::v1::UnloadLoraAdapterRequest request;
  request.set_lora_name(key);
  std::string failed;
  for (const auto& rank : ranks_) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kLoraCallTimeout);
    ferry::v1::LoraAdaptersResponse response;
    const grpc::Status status = rank->stub->UnloadLoraAdapter(&context, request, &response);
    if (!status.ok() && status.error_code() != grpc::StatusCode::NOT_FOUND) {
      failed += fmt::format("{}worker {}: {}", failed.empty() ? "" : "; ", rank->address, status.error_message());
    }
  }
  if (!failed.empty()) throw std::runtime_error(failed);
}

ferry::v1::WorkerInfo GrpcWorkerGroup::WaitForInfo(std::chrono::seconds timeout) {
  ferry::v1::WorkerInfo first = WaitForEveryRank(timeout);
  planned_ = first;
  return first;
}

ferry::v1::WorkerInfo GrpcWorkerGroup::WaitForEveryRank(std::chrono::seconds timeout) {
  const auto deadline = std::chrono::system_clock::now() + timeout;
  ferry::v1::WorkerInfo first;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    while (true) {
      grpc::ClientContext context;
      context.set_deadline(deadline);
      context.set_wait_for_ready(true);
      ferry::v1::WorkerInfo info;
      grpc::Status status = ranks_[r]->stub->Info(&context, {}, &info);
      if (status.ok()) {
        if (r == 0) first = info;
        // Every rank must hold every block id the scheduler hands out, and honour every option
        // the replica accepts.
        first.set_num_kv_blocks(std::min(first.num_kv_blocks(), info.num_kv_blocks()));
        first.set_supports_prompt_logprobs(first.supports_prompt_logprobs() && info.supports_prompt_logprobs());
        first.set_supports_guided_decoding(first.supports_guided_decoding() && info.supports_guided_decoding());
        // A method some rank lacks would have ranks propose different drafts: only common ones.
        std::vector<int> common;
        for (const int m : first.speculative_methods()) {
          if (std::find(info.speculative_methods().begin(), info.speculative_methods().end(), m) !=
              info.speculative_methods().end()) {
            common.push_back(m);
          }
        }
        first.mutable_speculative_methods()->Assign(common.begin(), common.end());
        // Every rank must run each adapter a sequence names: only common ones, at the smallest bound.
        std::vector<std::string> adapters;
        for (const std::string& name : first.lora_names()) {
          if (std::find(info.lora_names().begin(), info.lora_names().end(), name) != info.lora_names().end()) {
            adapters.push_back(name);
          }
        }
        first.mutable_lora_names()->Assign(adapters.begin(), adapters.end());
        first.set_max_loras(std::min(first.max_loras(), info.max_loras()));
        incarnations_[r] = info.incarnation_id();
        break;
      }
      if (std::chrono::system_clock::now() >= deadline) {
        throw std::runtime_error(fmt::format("worker {} not ready: {}", ranks_[r]->address, status.error_message()));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  return first;
}

void GrpcWorkerGroup::OpenStreams() {
  if (ranks_.front()->stream) return;
  std::lock_guard lock(watch_mu_);  // the watchdog cancels through the contexts
  for (auto& rank : ranks_) {
    rank->context = std::make_unique<grpc::ClientContext>();
    rank->stream = rank->stub->Step(rank->context.get());
  }
  steps_on_streams_ = 0;
}

void GrpcWorkerGroup::CloseStreams() {
  {
    std::lock_guard lock(watch_mu_);
    for (auto& rank : ranks_) {
      if (rank->context) rank->context->TryCancel();
    }
    pending_.clear();
    timed_out_ = false;
  }
  for (auto& rank : ranks_) {
    if (rank->stream) rank->stream->Finish();  // cancelled: returns at once
  }
  std::lock_guard lock(watch_mu_);
  for (auto& rank : ranks_) {
    rank->stream.reset();
    rank->context.reset();
  }
}

void GrpcWorkerGroup::Lost(size_t rank, const char* what) {
  bool timed_out;
  std::string why;
  {
    std::lock_guard lock(watch_mu_);
    timed_out = timed_out_;
    why = timeout_what_;
  }
  CloseStreams();
  if (timed_out) throw WorkerLostError(WorkerLostError::Reason::kStepTimeout, why);
  throw WorkerLostError(WorkerLostError::Reason::kDisconnected,
                        fmt::format("rank {} ({}): {}", rank, ranks_[rank]->address, what));
}

ferry::v1::StepRequest ToStepRequest(uint64_t step_id, const StepPlan& plan) {
  ferry::v1::StepRequest request;
  ToStepRequest(step_id, plan, request);
  return request;
}

void ToStepRequest(uint64_t step_id, const StepPlan& plan, ferry::v1::StepRequest& request) {
  request.Clear();
  request.set_step_id(step_id);
  for (const auto& seq : plan.new_sequences) {
    auto* out = request.add_new_sequences();
    out->set_seq_id(seq.seq_id);
    out->mutable_token_ids()->Add(seq.token_ids.begin(), seq.token_ids.end());
    out->set_num_generated(seq.num_generated);
    out->set_num_cached_tokens(seq.num_cached_tokens);
    out->set_lora_name(seq.lora_name);
    // The gateway's message as it came (its encoding parsed here; the scheduler read a copy).
    if (!out->mutable_sampling()->ParseFromString(seq.sampling.encoded)) {
      throw std::invalid_argument(fmt::format("sequence {}: sampling parameters do not decode", seq.seq_id));
    }
    out->mutable_min_tokens_suppressed_ids()->Add(seq.sampling.min_tokens_suppressed_ids.begin(),
                                                  seq.sampling.min_tokens_suppressed_ids.end());
    out->mutable_speculative()->set_method(ToProto(seq.sampling.speculative_method));
    out->mutable_speculative()->set_num_speculative_tokens(seq.sampling.num_speculative_tokens);
  }
  for (const auto& s : plan.scheduled) {
    auto* out = request.add_scheduled();
    out->set_seq_id(s.seq_id);
    out->set_num_tokens(s.num_tokens);
    out->mutable_new_block_ids()->Add(s.new_block_ids.begin(), s.new_block_ids.end());
    out->set_num_lookahead_tokens(s.num_lookahead_tokens);
  }
  request.mutable_finished_ids()->Add(plan.finished_ids.begin(), plan.finished_ids.end());
  request.mutable_preempted_ids()->Add(plan.preempted_ids.begin(), plan.preempted_ids.end());
}

void GrpcWorkerGroup::Send(uint64_t step_id, const StepPlan& plan) {
  OpenStreams();
  ToStepRequest(step_id, plan, request_);
  {
    std::lock_guard lock(watch_mu_);
    const bool was_idle = pending_.empty();
    pending_.push_back(Pending{step_id, std::chrono::steady_clock::now(), steps_on_streams_ < timeouts_.num_first_steps});
    ++steps_on_streams_;
    if (was_idle) watch_cv_.notify_one();  // else the watchdog wakes at the older step's due time
  }
  // Every rank gets the same plan; writes first so ranks run concurrently.
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (!ranks_[r]->stream->Write(request_)) Lost(r, "the step stream closed while sending");
  }
}

namespace {

TokenLogprob FromProto(const ferry::v1::TokenLogprob& in) {
  TokenLogprob lp{.token_id = in.token_id(), .logprob = in.logprob(), .rank = in.rank(), .top = {}};
  lp.top.reserve(in.top_size());
  for (const auto& top : in.top()) lp.top.emplace_back(top.token_id(), top.logprob());
  return lp;
}

}  // namespace

void FromStepResult(const ferry::v1::StepResult& result, StepOutput& output) {
  output.sampled.clear();
  output.prompt_logprobs.clear();
  output.refused.clear();
  // Every rank refuses the same sequences (their checks read only the request): rank 0's say which.
  for (const auto& e : result.sequence_errors()) output.refused.push_back({e.seq_id(), e.message()});
  for (const auto& s : result.sampled()) {
    SampledToken& token = output.sampled.emplace_back(SampledToken{s.seq_id(), s.token_id(), std::nullopt});
    if (s.has_logprob()) token.logprob = FromProto(s.logprob());
  }
  for (const auto& p : result.prompt_logprobs()) {
    PromptLogprobs& out = output.prompt_logprobs.emplace_back();
    out.seq_id = p.seq_id();
    out.first_index = p.first_index();
    for (const auto& lp : p.logprobs()) out.logprobs.push_back(FromProto(lp));
  }
}

void GrpcWorkerGroup::Receive(StepOutput& output) {
  if (!ranks_.front()->stream) {
    throw WorkerLostError(WorkerLostError::Reason::kDisconnected, "no step in flight: the worker streams are closed");
  }
  std::string error;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    {
      std::lock_guard lock(watch_mu_);
      reading_rank_ = r;
    }
    ferry::v1::StepResult& result = ranks_[r]->result;
    if (!ranks_[r]->stream->Read(&result)) Lost(r, "the step stream closed (the worker died or restarted)");
    if (!result.error().empty() && error.empty()) error = result.error();
    if (r == 0) FromStepResult(result, output);
  }
  {
    std::lock_guard lock(watch_mu_);
    pending_.erase(pending_.begin());
    last_done_ = std::chrono::steady_clock::now();
  }
  if (!error.empty()) throw std::runtime_error("worker failed step: " + error);
}

namespace {

// Why `info` cannot take the place of the rank the replica was planned for; empty if it can.
std::string Unfit(const ferry::v1::WorkerInfo& info, const ferry::v1::WorkerInfo& planned) {
  if (info.model() != planned.model()) return fmt::format("serves model {}, not {}", info.model(), planned.model());
  if (info.block_size() != planned.block_size()) {
    return fmt::format("has block size {}, not {}", info.block_size(), planned.block_size());
  }
  if (info.vocab_size() != planned.vocab_size()) {
    return fmt::format("has vocab size {}, not {}", info.vocab_size(), planned.vocab_size());
  }
  if (info.num_kv_blocks() < planned.num_kv_blocks()) {
    return fmt::format("holds {} KV blocks, fewer than the {} the replica plans with", info.num_kv_blocks(),
                       planned.num_kv_blocks());
  }
  if (info.max_model_len() < planned.max_model_len()) {
    return fmt::format("has max_model_len {}, below {}", info.max_model_len(), planned.max_model_len());
  }
  return "";
}

}  // namespace

void GrpcWorkerGroup::CheckIdle() {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + timeouts_.step);
    ferry::v1::WorkerInfo info;
    const grpc::Status status = ranks_[r]->stub->Info(&context, {}, &info);
    if (status.ok() && info.incarnation_id() == incarnations_[r]) continue;
    // Not Lost(): no step is pending, so a timeout flag left from an earlier connection is not the reason.
    CloseStreams();
    const std::string rank = fmt::format("rank {} ({})", r, ranks_[r]->address);
    if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      throw WorkerLostError(WorkerLostError::Reason::kStepTimeout,
                            fmt::format("{} did not answer Info within the step timeout ({} s) while idle", rank,
                                        std::chrono::duration<double>(timeouts_.step).count()));
    }
    throw WorkerLostError(WorkerLostError::Reason::kDisconnected,
                          status.ok() ? fmt::format("{} restarted while idle (a new incarnation answers)", rank)
                                      : fmt::format("{} does not answer while idle: {}", rank, status.error_message()));
  }
}

Reconnection GrpcWorkerGroup::Reconnect(std::chrono::milliseconds timeout) {
  CloseStreams();
  std::vector<uint64_t> incarnations(ranks_.size());
  std::vector<int32_t> restarted, kept;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const Rank& rank = *ranks_[r];
    grpc::ClientContext info_context;
    info_context.set_deadline(std::chrono::system_clock::now() + timeout);
    ferry::v1::WorkerInfo info;
    if (const grpc::Status status = rank.stub->Info(&info_context, {}, &info); !status.ok()) {
      return Reconnection{.detail = fmt::format("rank {} ({}) does not answer: {}", r, rank.address,
                                                status.error_message())};
    }
    if (const std::string why = Unfit(info, planned_); !why.empty()) {
      return Reconnection{.detail = fmt::format("rank {} ({}) {}", r, rank.address, why)};
    }
    grpc::ClientContext health_context;
    health_context.set_deadline(std::chrono::system_clock::now() + timeout);
    ferry::v1::HealthResponse health;
    if (!rank.stub->Health(&health_context, {}, &health).ok() || !health.ok()) {
      return Reconnection{.detail = fmt::format("rank {} ({}) is not healthy: {}", r, rank.address, health.reason())};
    }
    // A step of the lost connection still runs (a step timeout on a slow, not hung, worker): the new
    // stream's steps would wait behind it and time out in turn. Resume once it is done.
    if (health.step_running_s() > 0) {
      return Reconnection{.detail = fmt::format("rank {} ({}) still runs a step of the lost connection ({:.1f} s)",
                                                r, rank.address, health.step_running_s())};
    }
    incarnations[r] = info.incarnation_id();
    (incarnations[r] == incarnations_[r] ? kept : restarted).push_back(static_cast<int32_t>(r));
  }
  if (!restarted.empty() && !kept.empty()) {
    return Reconnection{.detail = fmt::format("ranks {} restarted and ranks {} did not: a tensor-parallel group "
                                              "rejoins only whole (its supervisor restarts every rank)",
                                              fmt::join(restarted, ","), fmt::join(kept, ","))};
  }
  incarnations_ = incarnations;
  return Reconnection{.back = true, .restarted_ranks = restarted,
                      .detail = restarted.empty() ? "the same incarnations answer"
                                                  : fmt::format("ranks {} restarted", fmt::join(restarted, ","))};
}

}  // namespace ferry::scheduler
