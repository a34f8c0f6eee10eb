#include "tools/bench/grpc_client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <stdexcept>
#include <vector>

#include "ferry/v1/generation.grpc.pb.h"
#include "ferry/v1/scheduler.grpc.pb.h"

namespace ferry::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::chrono::system_clock::time_point DeadlineIn(double seconds) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::duration<double>(seconds));
}

ferry::v1::GenerateRequest ToProto(const BenchRequest& r, const GrpcClientOptions& options) {
  ferry::v1::GenerateRequest req;
  req.set_request_id("bench-" + std::to_string(r.index));
  if (r.prompt_text.empty()) {
    req.mutable_token_ids()->mutable_ids()->Add(r.prompt_token_ids.begin(), r.prompt_token_ids.end());
  } else {
    req.set_text(r.prompt_text);
  }
  req.set_lane(r.lane);
  auto* s = req.mutable_sampling();
  s->set_max_tokens(r.max_tokens);
  s->set_temperature(options.temperature);
  s->set_seed(r.seed);
  s->set_ignore_eos(options.ignore_eos);
  return req;
}

// A finish that is not a normal end (stop, length, eos) fails the request even on an OK status.
std::string FinishStatus(ferry::v1::FinishReason reason) {
  switch (reason) {
    case ferry::v1::FINISH_REASON_STOP:
    case ferry::v1::FINISH_REASON_LENGTH:
    case ferry::v1::FINISH_REASON_EOS: return kStatusOk;
    case ferry::v1::FINISH_REASON_UNSPECIFIED: return "NO_FINISH";
    default: {  // FINISH_REASON_TIMEOUT -> FINISH_TIMEOUT: the gateway ended it (its deadline, an engine error)
      const std::string name = ferry::v1::FinishReason_Name(reason);
      return "FINISH_" + name.substr(name.rfind('_') + 1);
    }
  }
}

class GrpcClient final : public GenerationClient {
 public:
  GrpcClient(std::shared_ptr<grpc::Channel> channel, const GrpcClientOptions& options)
      : stub_(ferry::v1::Generation::NewStub(std::move(channel))), options_(options) {}

  void Send(const BenchRequest& request, double timeout_s, RequestResult& result) override {
    const ferry::v1::GenerateRequest req = ToProto(request, options_);
    grpc::ClientContext context;
    context.set_deadline(DeadlineIn(timeout_s));
    if (!options_.api_key.empty()) context.AddMetadata("authorization", "Bearer " + options_.api_key);
    const auto t0 = Clock::now();
    auto reader = stub_->GenerateStream(&context, req);
    ferry::v1::GenerateChunk chunk;
    ferry::v1::FinishReason finish = ferry::v1::FINISH_REASON_UNSPECIFIED;
    ferry::v1::Usage usage;
    int32_t num_tokens = 0;
    double last_s = -1;
    while (reader->Read(&chunk)) {
      if (chunk.token_ids_size() > 0 || !chunk.text().empty()) {
        last_s = Since(t0);
        result.chunk_s.push_back(last_s);
      }
      num_tokens += chunk.token_ids_size();
      if (chunk.finish_reason() != ferry::v1::FINISH_REASON_UNSPECIFIED) {
        finish = chunk.finish_reason();
        usage = chunk.usage();
      }
    }
    const grpc::Status status = reader->Finish();
    result.e2e_s = last_s >= 0 ? last_s : Since(t0);
    result.output_tokens = usage.completion_tokens() > 0 ? usage.completion_tokens() : num_tokens;
    if (usage.prompt_tokens() > 0) result.prompt_tokens = usage.prompt_tokens();
    if (!status.ok()) {
      result.status = GrpcCodeName(status.error_code());
      result.error = status.error_message();
      return;
    }
    result.status = FinishStatus(finish);
    if (!result.is_success()) result.error = "stream ended with finish reason " + result.status;
  }

 private:
  std::unique_ptr<ferry::v1::Generation::Stub> stub_;
  const GrpcClientOptions options_;
};

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, int index) {
  grpc::ChannelArguments args;
  // Separate TCP connections: identical channels would share one subchannel (one connection).
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("ferry.bench.channel_index", index);
  args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 64 << 20);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

}  // namespace

std::string GrpcCodeName(int code) {
  static const char* const kNames[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
                                       "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
                                       "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  if (code >= 0 && code < static_cast<int>(std::size(kNames))) return kNames[code];
  return "GRPC_" + std::to_string(code);
}

ClientFactory MakeGrpcClientFactory(const GrpcClientOptions& options) {
  auto channels = std::make_shared<std::vector<std::shared_ptr<grpc::Channel>>>();
  for (int i = 0; i < std::max(1, options.num_channels); ++i) {
    channels->push_back(MakeChannel(options.target, i));
    channels->back()->WaitForConnected(DeadlineIn(options.connect_timeout_s));
  }
  auto next = std::make_shared<std::atomic<size_t>>(0);
  return [channels, next, options] {
    const size_t i = next->fetch_add(1) % channels->size();
    return std::make_unique<GrpcClient>((*channels)[i], options);
  };
}

struct SchedulerAdmin::Impl {
  std::unique_ptr<ferry::v1::Scheduler::Stub> stub;
  double timeout_s;

  void Check(const grpc::Status& status, const char* rpc) const {
    if (!status.ok()) {
      throw std::runtime_error(std::string("Scheduler.") + rpc + ": " + GrpcCodeName(status.error_code()) + ": " +
                               status.error_message());
    }
  }
  void Prepare(grpc::ClientContext& context) const {
    context.set_deadline(DeadlineIn(timeout_s));
    context.set_wait_for_ready(true);
  }
};

namespace {

SchedulerSnapshot FromProto(const ferry::v1::SchedulerState& s) {
  SchedulerSnapshot out;
  out.max_num_seqs = s.max_num_seqs();
  out.controller_mode = s.controller_mode();
  out.num_running = s.num_running();
  out.num_waiting = s.num_waiting();
  out.kv_cache_usage = s.kv_cache_usage();
  out.num_preemptions = s.num_preemptions();
  out.num_cap_changes = s.num_cap_changes();
  return out;
}

}  // namespace

SchedulerAdmin::SchedulerAdmin(const std::string& address, double timeout_s)
    : impl_(std::make_unique<Impl>(Impl{ferry::v1::Scheduler::NewStub(
                                            grpc::CreateChannel(address, grpc::InsecureChannelCredentials())),
                                        timeout_s})) {}

SchedulerAdmin::~SchedulerAdmin() = default;

SchedulerSnapshot SchedulerAdmin::SetMaxNumSeqs(int32_t max_num_seqs) {
  grpc::ClientContext context;
  impl_->Prepare(context);
  ferry::v1::SetMaxNumSeqsRequest request;
  request.set_max_num_seqs(max_num_seqs);
  ferry::v1::SchedulerState state;
  impl_->Check(impl_->stub->SetMaxNumSeqs(&context, request, &state), "SetMaxNumSeqs");
  return FromProto(state);
}

SchedulerSnapshot SchedulerAdmin::GetState() {
  grpc::ClientContext context;
  impl_->Prepare(context);
  ferry::v1::SchedulerState state;
  impl_->Check(impl_->stub->GetState(&context, ferry::v1::GetStateRequest(), &state), "GetState");
  return FromProto(state);
}

SchedulerFacts SchedulerAdmin::Info() {
  grpc::ClientContext context;
  impl_->Prepare(context);
  ferry::v1::SchedulerInfo info;
  impl_->Check(impl_->stub->Info(&context, ferry::v1::SchedulerInfoRequest(), &info), "Info");
  SchedulerFacts out;
  out.model = info.model();
  out.max_model_len = info.max_model_len();
  out.num_kv_blocks = info.num_kv_blocks();
  out.block_size = info.block_size();
  out.tensor_parallel_size = info.tensor_parallel_size();
  return out;
}

}  // namespace ferry::bench
