#include "tools/bench/grpc_client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <future>
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
  req.set_lora_name(r.lora_name);
  auto* s = req.mutable_sampling();
  s->set_max_tokens(r.max_tokens);
  const BenchSampling& o = options.sampling;
  s->set_temperature(o.temperature);
  if (o.top_p) s->set_top_p(*o.top_p);
  if (o.top_k) s->set_top_k(*o.top_k);
  if (o.min_p) s->set_min_p(*o.min_p);
  if (o.repetition_penalty) s->set_repetition_penalty(*o.repetition_penalty);
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

// One GenerateStream call read by gRPC's callback threads: each chunk is timed where it arrives,
// and the sending thread sleeps until the end. (Blocking Reads cost a thread hand-off per chunk,
// as they did in the services: docs/benchmarks/bench.md 2d, 2e.) It owns what the call needs until
// OnDone, the last callback, which drops its hold on itself.
class StreamCall final : public grpc::ClientReadReactor<ferry::v1::GenerateChunk> {
 public:
  StreamCall(ferry::v1::GenerateRequest request, RequestResult& result) : request_(std::move(request)), result_(result) {}

  // Starts the call; the future is ready (with the call's status) once it has ended.
  std::future<grpc::Status> Start(ferry::v1::Generation::Stub& stub, std::shared_ptr<StreamCall> self,
                                  double timeout_s, const std::string& api_key) {
    self_ = std::move(self);
    context_.set_deadline(DeadlineIn(timeout_s));
    if (!api_key.empty()) context_.AddMetadata("authorization", "Bearer " + api_key);
    std::future<grpc::Status> done = done_.get_future();
    t0_ = Clock::now();
    stub.async()->GenerateStream(&context_, &request_, this);
    StartRead(&chunk_);
    StartCall();
    return done;
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended: OnDone follows
    if (chunk_.token_ids_size() > 0 || !chunk_.text().empty()) {
      last_s_ = Since(t0_);
      result_.chunk_s.push_back(last_s_);
    }
    num_tokens_ += chunk_.token_ids_size();
    if (chunk_.finish_reason() != ferry::v1::FINISH_REASON_UNSPECIFIED) {
      finish_ = chunk_.finish_reason();
      usage_ = chunk_.usage();
    }
    StartRead(&chunk_);
  }

  void OnDone(const grpc::Status& status) override {
    const std::shared_ptr<StreamCall> keep = std::move(self_);  // this outlives the callback
    result_.e2e_s = last_s_ >= 0 ? last_s_ : Since(t0_);
    result_.output_tokens = usage_.completion_tokens() > 0 ? usage_.completion_tokens() : num_tokens_;
    if (usage_.prompt_tokens() > 0) result_.prompt_tokens = usage_.prompt_tokens();
    if (!status.ok()) {
      result_.status = GrpcCodeName(status.error_code());
      result_.error = status.error_message();
    } else {
      result_.status = FinishStatus(finish_);
      if (!result_.is_success()) result_.error = "stream ended with finish reason " + result_.status;
    }
    done_.set_value(status);
  }

 private:
  const ferry::v1::GenerateRequest request_;
  RequestResult& result_;
  std::shared_ptr<StreamCall> self_;
  grpc::ClientContext context_;
  std::promise<grpc::Status> done_;
  Clock::time_point t0_;
  ferry::v1::GenerateChunk chunk_;
  ferry::v1::FinishReason finish_ = ferry::v1::FINISH_REASON_UNSPECIFIED;
  ferry::v1::Usage usage_;
  int32_t num_tokens_ = 0;
  double last_s_ = -1;
};

class GrpcClient final : public GenerationClient {
 public:
  GrpcClient(std::shared_ptr<grpc::Channel> channel, const GrpcClientOptions& options)
      : stub_(ferry::v1::Generation::NewStub(std::move(channel))), options_(options) {}

  void Send(const BenchRequest& request, double timeout_s, RequestResult& result) override {
    auto call = std::make_shared<StreamCall>(ToProto(request, options_), result);
    call->Start(*stub_, call, timeout_s, options_.api_key).wait();
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
  out.cap_held = s.cap_held();
  return out;
}

}  // namespace

SchedulerAdmin::SchedulerAdmin(const std::string& address, double timeout_s)
    : impl_(std::make_unique<Impl>(Impl{ferry::v1::Scheduler::NewStub(
                                            grpc::CreateChannel(address, grpc::InsecureChannelCredentials())),
                                        timeout_s})) {}

SchedulerAdmin::~SchedulerAdmin() = default;

SchedulerSnapshot SchedulerAdmin::SetMaxNumSeqs(int32_t max_num_seqs, bool adapt) {
  grpc::ClientContext context;
  impl_->Prepare(context);
  ferry::v1::SetMaxNumSeqsRequest request;
  request.set_max_num_seqs(max_num_seqs);
  request.set_adapt(adapt);
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
