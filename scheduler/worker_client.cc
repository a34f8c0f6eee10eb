#include "scheduler/worker_client.h"

#include <algorithm>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace ferry::scheduler {

struct GrpcWorkerGroup::Rank {
  std::string address;
  std::unique_ptr<ferry::v1::Worker::Stub> stub;
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientReaderWriter<ferry::v1::StepRequest, ferry::v1::StepResult>> stream;
  ferry::v1::StepResult result;  // Receive's, reused: parsing clears it and keeps its elements
};

GrpcWorkerGroup::GrpcWorkerGroup(std::vector<std::string> addresses) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  for (auto& address : addresses) {
    auto rank = std::make_unique<Rank>();
    rank->address = address;
    rank->stub = ferry::v1::Worker::NewStub(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
    ranks_.push_back(std::move(rank));
  }
}

GrpcWorkerGroup::~GrpcWorkerGroup() { CloseStreams(); }

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

ferry::v1::WorkerInfo GrpcWorkerGroup::WaitForInfo(std::chrono::seconds timeout) {
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
  for (auto& rank : ranks_) {
    if (rank->stream) continue;
    rank->context = std::make_unique<grpc::ClientContext>();
    rank->stream = rank->stub->Step(rank->context.get());
  }
}

void GrpcWorkerGroup::CloseStreams() {
  for (auto& rank : ranks_) {
    if (!rank->stream) continue;
    rank->stream->WritesDone();
    rank->stream->Finish();
    rank->stream.reset();
    rank->context.reset();
  }
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
    // The gateway's message as it came (its encoding parsed here; the scheduler read a copy).
    if (!out->mutable_sampling()->ParseFromString(seq.sampling.encoded)) {
      throw std::invalid_argument(fmt::format("sequence {}: sampling parameters do not decode", seq.seq_id));
    }
    out->mutable_min_tokens_suppressed_ids()->Add(seq.sampling.min_tokens_suppressed_ids.begin(),
                                                  seq.sampling.min_tokens_suppressed_ids.end());
  }
  for (const auto& s : plan.scheduled) {
    auto* out = request.add_scheduled();
    out->set_seq_id(s.seq_id);
    out->set_num_tokens(s.num_tokens);
    out->mutable_new_block_ids()->Add(s.new_block_ids.begin(), s.new_block_ids.end());
  }
  request.mutable_finished_ids()->Add(plan.finished_ids.begin(), plan.finished_ids.end());
  request.mutable_preempted_ids()->Add(plan.preempted_ids.begin(), plan.preempted_ids.end());
}

void GrpcWorkerGroup::Send(uint64_t step_id, const StepPlan& plan) {
  OpenStreams();
  ToStepRequest(step_id, plan, request_);
  // Every rank gets the same plan; writes first so ranks run concurrently.
  for (auto& rank : ranks_) {
    if (!rank->stream->Write(request_)) {
      CloseStreams();
      throw std::runtime_error(fmt::format("worker {} stream closed", rank->address));
    }
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
  if (!ranks_.front()->stream) throw std::runtime_error("no step in flight: the worker streams are closed");
  std::string error;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    ferry::v1::StepResult& result = ranks_[r]->result;
    if (!ranks_[r]->stream->Read(&result)) {
      CloseStreams();
      throw std::runtime_error(fmt::format("worker {} stream closed", ranks_[r]->address));
    }
    if (!result.error().empty() && error.empty()) error = result.error();
    if (r == 0) FromStepResult(result, output);
  }
  if (!error.empty()) throw std::runtime_error("worker failed step: " + error);
}

}  // namespace ferry::scheduler
