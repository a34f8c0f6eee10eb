// GenerationCall's contract (generation_call.h) against scripted schedulers served over real gRPC
// on loopback (through grpc_scheduler_client.h): flow control, a client that goes away, failover
// before the start, refusals, and the blocking Run built on it. End-to-end behaviour with the
// real services is in tests/python.
#include "gateway/generation_call.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <prometheus/registry.h>

#include "ferry/v1/scheduler.grpc.pb.h"
#include "gateway/generator.h"
#include "gateway/grpc_scheduler_client.h"
#include "gateway/tokenizer/bpe_trainer.h"

namespace ferry::gateway {
namespace {

using namespace std::chrono_literals;
using ferry::v1::GenerateChunk;
using ferry::v1::TokenEvent;

const tokenizer::Tokenizer& TestTokenizer() {
  static const auto tok = tokenizer::Tokenizer::FromJson(tokenizer::TrainQwen2TokenizerJson(
      tokenizer::DefaultTrainingCorpus(), 600, {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}));
  return *tok;
}

// Answers each submit of a session with `events`, each in a message of its own; with `refusal`,
// ends the session at the first submit. Unless an event ends the request, it stays open until the
// gateway cancels it (seen in saw_cancel) or the session ends.
class ScriptedScheduler final : public ferry::v1::Scheduler::Service {
 public:
  grpc::Status Session(grpc::ServerContext*,
                       grpc::ServerReaderWriter<ferry::v1::SessionEvents, ferry::v1::SessionRequests>* stream) override {
    ++sessions;
    ferry::v1::SessionRequests in;
    while (stream->Read(&in)) {
      if (in.cancels_size() > 0) saw_cancel = true;
      for (const auto& submit : in.submits()) {
        ++submits;
        {
          std::lock_guard lock(mu);
          last_submit = submit.request();
        }
        if (!refusal.ok()) return refusal;
        for (size_t i = 0; i < events.size(); ++i) {
          if (i > 0) std::this_thread::sleep_for(gap);
          TokenEvent event = events[i];
          event.set_stream_id(submit.stream_id());
          ferry::v1::SessionEvents out;
          *out.add_events() = std::move(event);
          if (!stream->Write(out)) return grpc::Status::CANCELLED;
        }
        if (!after_events.ok()) {
          std::this_thread::sleep_for(gap);  // what was sent reaches the gateway first
          return after_events;
        }
      }
    }
    return grpc::Status::OK;
  }

  std::vector<TokenEvent> events;
  // Between two events: what arrives together is handed out together (one chunk), so a test of
  // chunk boundaries spaces them.
  std::chrono::milliseconds gap{0};
  grpc::Status refusal = grpc::Status::OK;
  // With a status: the session ends with it once the first submit's events went out (a replica lost
  // in the middle of the request).
  grpc::Status after_events = grpc::Status::OK;
  std::atomic<int> sessions{0};
  std::atomic<int> submits{0};
  std::atomic<bool> saw_cancel{false};
  std::mutex mu;
  ferry::v1::SubmitRequest last_submit;  // guarded by mu
  ferry::v1::SubmitRequest LastSubmit() {
    std::lock_guard lock(mu);
    return last_submit;
  }
};

struct Server {
  // port 0: the kernel chooses.
  explicit Server(ScriptedScheduler& service, int at_port = 0) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:" + std::to_string(at_port), grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~Server() { server->Shutdown(std::chrono::system_clock::now() + 200ms); }
  std::shared_ptr<grpc::Channel> Channel() const {
    return grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  }
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

TokenEvent Event(std::vector<int32_t> ids, ferry::v1::FinishKind finish = ferry::v1::FINISH_KIND_NONE) {
  TokenEvent event;
  for (int32_t id : ids) event.add_token_ids(id);
  event.set_finish(finish);
  return event;
}

// The gRPC scheduler client, counting the streams calls open (one per attempt).
class CountingClient final : public SchedulerClient {
 public:
  explicit CountingClient(std::vector<std::shared_ptr<grpc::Channel>> channels)
      : client_(MakeGrpcSchedulerClient(channels, std::vector<std::string>(channels.size(), "scripted"))) {}
  ReplicaRouter& router() override { return client_->router(); }
  SchedulerStream* NewStream(size_t replica, const ferry::v1::SubmitRequest& submit,
                             std::chrono::system_clock::time_point deadline,
                             std::shared_ptr<StreamReader> reader) override {
    ++num_streams;
    return client_->NewStream(replica, submit, deadline, std::move(reader));
  }
  void After(std::chrono::milliseconds delay, std::function<void()> fn) override {
    client_->After(delay, std::move(fn));
  }
  std::atomic<size_t> num_streams{0};

 private:
  std::shared_ptr<SchedulerClient> client_;
};

// A front that records what the call hands it and answers writes only when told to.
class RecordingFront {
 public:
  CallHooks Hooks() {
    CallHooks hooks;
    hooks.client_cancelled = [] { return false; };
    hooks.write = [this](GenerateChunk chunk) {
      std::lock_guard lock(mu_);
      chunks_.push_back(std::move(chunk));
      cv_.notify_all();
    };
    hooks.done = [this](Status status, int64_t) {
      std::lock_guard lock(mu_);
      status_ = std::move(status);
      cv_.notify_all();
    };
    return hooks;
  }
  // Waits (up to 10 s) until `n` chunks were written.
  bool WaitChunks(size_t n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, 10s, [&] { return chunks_.size() >= n; });
  }
  std::optional<Status> status_now() {
    std::lock_guard lock(mu_);
    return status_;
  }
  std::optional<Status> WaitDone() {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, 10s, [&] { return status_.has_value(); });
    return status_;
  }
  size_t num_chunks() {
    std::lock_guard lock(mu_);
    return chunks_.size();
  }
  GenerateChunk chunk(size_t i) {
    std::lock_guard lock(mu_);
    return chunks_.at(i);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<GenerateChunk> chunks_;
  std::optional<Status> status_;
};

class GenerationCallTest : public ::testing::Test {
 protected:
  std::unique_ptr<Generator> MakeGenerator(std::vector<std::shared_ptr<grpc::Channel>> channels,
                                           int32_t stream_interval = 1,
                                           int32_t migration_limit = kDefaultMigrationLimit) {
    GatewayOptions options;
    options.stream_interval = stream_interval;
    options.migration_limit = migration_limit;
    options.limits.max_model_len = 128;
    options.limits.vocab_size = static_cast<int32_t>(TestTokenizer().vocab_size());
    client_ = std::make_shared<CountingClient>(std::move(channels));
    return std::make_unique<Generator>(TestTokenizer(), client_, options, registry_);
  }
  // Scheduler streams the calls opened.
  size_t num_attempts() const { return client_->num_streams; }
  static ferry::v1::GenerateRequest Request(int32_t max_tokens) {
    ferry::v1::GenerateRequest request;
    request.set_text("hello world");
    request.mutable_sampling()->set_max_tokens(max_tokens);
    return request;
  }
  std::vector<int32_t> Ids(const std::string& text) { return TestTokenizer().Encode(text); }

  prometheus::Registry registry_;
  std::shared_ptr<CountingClient> client_;
};

// The front's pace is the call's: what arrives while the front writes a chunk waits, and goes
// out merged into the next one.
TEST_F(GenerationCallTest, AChunkIsWrittenOnlyAfterTheFrontTookTheLastAndMergesWhatCameMeanwhile) {
  ScriptedScheduler scheduler;
  const auto ids = Ids("one two three");
  ASSERT_GE(ids.size(), 3u);
  scheduler.events = {Event({ids[0]}), Event({ids[1]}), Event({ids[2]}, ferry::v1::FINISH_KIND_LENGTH)};
  scheduler.gap = 20ms;
  Server server(scheduler);
  auto generator = MakeGenerator({server.Channel()});
  RecordingFront front;
  auto call = generator->NewCall(front.Hooks());
  call->Start(Request(3));
  ASSERT_TRUE(front.WaitChunks(1));
  // The scheduler has sent everything; unanswered, the call holds back.
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(front.num_chunks(), 1u);
  call->WriteDone(true);
  ASSERT_TRUE(front.WaitChunks(2));
  const GenerateChunk last = front.chunk(1);
  EXPECT_EQ(last.finish_reason(), ferry::v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(last.usage().completion_tokens(), 3);
  EXPECT_EQ(std::vector<int32_t>(last.token_ids().begin(), last.token_ids().end()),
            (std::vector<int32_t>{ids[1], ids[2]}));
  EXPECT_EQ(front.chunk(0).token_ids(0), ids[0]);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(num_attempts(), 1u);
  call->WriteDone(true);  // the final chunk's answer ends the call
  const auto status = front.WaitDone();
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->ok()) << status->error_message();
}

TEST_F(GenerationCallTest, AClientThatGoesAwayCancelsTheSchedulerStream) {
  ScriptedScheduler scheduler;
  scheduler.events = {Event({Ids("one")[0]})};
  Server server(scheduler);
  auto generator = MakeGenerator({server.Channel()});
  RecordingFront front;
  auto call = generator->NewCall(front.Hooks());
  call->Start(Request(8));
  ASSERT_TRUE(front.WaitChunks(1));
  call->WriteDone(false);
  const auto status = front.WaitDone();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), StatusCode::kCancelled) << status->error_message();
  for (int i = 0; i < 200 && !scheduler.saw_cancel; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(scheduler.saw_cancel);
  EXPECT_EQ(front.num_chunks(), 1u);  // no final chunk for a client that is gone
}

TEST_F(GenerationCallTest, AReplicaUnavailableBeforeTheStartIsLeftForTheNext) {
  ScriptedScheduler down, up;
  down.refusal = grpc::Status(grpc::StatusCode::UNAVAILABLE, "going away");
  up.events = {Event({Ids("one")[0]}, ferry::v1::FINISH_KIND_EOS)};
  Server first(down), second(up);
  auto generator = MakeGenerator({first.Channel(), second.Channel()});  // equal load: replica 0 first
  RecordingFront front;
  auto call = generator->NewCall(front.Hooks());
  call->Start(Request(8));
  ASSERT_TRUE(front.WaitChunks(1));
  EXPECT_EQ(front.chunk(0).finish_reason(), ferry::v1::FINISH_REASON_EOS);
  call->WriteDone(true);
  const auto status = front.WaitDone();
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->ok()) << status->error_message();
  EXPECT_EQ(down.submits, 1);
  EXPECT_EQ(up.submits, 1);
  EXPECT_EQ(num_attempts(), 2u);  // a fresh stream (and context) per attempt
}

// The replica had scheduled the request (its first event came, with no token yet) when it was lost:
// the client has nothing, so the request runs again on the next replica, and the client sees
// only that run.
TEST_F(GenerationCallTest, AReplicaLostAfterTheStartButBeforeAnyOutputIsLeftForTheNext) {
  ScriptedScheduler lost, up;
  TokenEvent started;
  started.set_queue_s(0.001);
  lost.events = {started};
  lost.gap = 50ms;
  lost.after_events = grpc::Status(grpc::StatusCode::UNAVAILABLE, "scheduler lost");
  auto ids = Ids("one two");
  ASSERT_GE(ids.size(), 2u);
  ids.resize(2);
  up.events = {Event(ids, ferry::v1::FINISH_KIND_LENGTH)};
  Server first(lost), second(up);
  auto generator = MakeGenerator({first.Channel(), second.Channel()});  // equal load: replica 0 first
  RecordingFront front;
  auto call = generator->NewCall(front.Hooks());
  call->Start(Request(2));
  ASSERT_TRUE(front.WaitChunks(1));
  const GenerateChunk only = front.chunk(0);
  EXPECT_EQ(only.finish_reason(), ferry::v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(std::vector<int32_t>(only.token_ids().begin(), only.token_ids().end()), ids);
  EXPECT_EQ(only.usage().completion_tokens(), 2);
  call->WriteDone(true);
  const auto status = front.WaitDone();
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->ok()) << status->error_message();
  EXPECT_EQ(lost.submits, 1);
  EXPECT_EQ(up.submits, 1);
  EXPECT_EQ(front.num_chunks(), 1u);
}

// Once the client has tokens, a lost replica's request resumes on the next as a continuation: the
// prompt as admitted plus every token the client has (the seeded draw, the penalties and max_tokens
// go on from there at the scheduler), and the client sees one answer, usage counted once.
TEST_F(GenerationCallTest, AReplicaLostAfterOutputResumesOnTheNextWithTheTokensItHas) {
  const auto ids = Ids("one two three four");
  ASSERT_GE(ids.size(), 4u);
  ScriptedScheduler lost, other;
  lost.events = {Event({ids[0]}), Event({ids[1]})};
  lost.gap = 50ms;
  lost.after_events = grpc::Status(grpc::StatusCode::UNAVAILABLE, "scheduler lost");
  other.events = {Event({ids[2]}), Event({ids[3]}, ferry::v1::FINISH_KIND_LENGTH)};
  Server first(lost), second(other);
  auto generator = MakeGenerator({first.Channel(), second.Channel()});
  CallHooks hooks;
  hooks.client_cancelled = [] { return false; };
  std::vector<int32_t> seen;
  std::string text;
  GenerateChunk last;
  ferry::v1::GenerateRequest request = Request(4);
  request.mutable_sampling()->set_seed(77);
  const Status status = generator->Run(request, hooks, [&](const GenerateChunk& c) {
    seen.insert(seen.end(), c.token_ids().begin(), c.token_ids().end());
    text += c.text();
    last = c;
    return true;
  });
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(seen, std::vector<int32_t>(ids.begin(), ids.begin() + 4));
  EXPECT_EQ(text, TestTokenizer().Decode(std::vector<int32_t>(ids.begin(), ids.begin() + 4)));
  EXPECT_EQ(last.finish_reason(), ferry::v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(last.usage().completion_tokens(), 4);
  const ferry::v1::SubmitRequest resumed = other.LastSubmit();
  EXPECT_EQ(std::vector<int32_t>(resumed.generated_token_ids().begin(), resumed.generated_token_ids().end()),
            (std::vector<int32_t>{ids[0], ids[1]}));
  EXPECT_EQ(resumed.prompt_token_ids_size(), lost.LastSubmit().prompt_token_ids_size());
  EXPECT_EQ(resumed.sampling().seed(), 77u);
  EXPECT_EQ(resumed.sampling().max_tokens(), 4);  // the scheduler counts the given tokens
  EXPECT_EQ(resumed.queue_timeout_ms(), 0);       // started long ago: only its deadline bounds it
  EXPECT_EQ(lost.LastSubmit().generated_token_ids_size(), 0);
}

// A stop string whose first part came before the loss and the rest after it ends the text where the
// uninterrupted request would have: the held-back prefix is the call's, not the scheduler's.
TEST_F(GenerationCallTest, AStopStringAcrossTheSeamStopsTheText) {
  const auto ids = Ids("one two three");
  ASSERT_GE(ids.size(), 3u);
  ScriptedScheduler lost, other;
  lost.events = {Event({ids[0]}), Event({ids[1]})};
  lost.gap = 50ms;
  lost.after_events = grpc::Status(grpc::StatusCode::UNAVAILABLE, "scheduler lost");
  other.events = {Event({ids[2]}), Event({ids[0]}, ferry::v1::FINISH_KIND_LENGTH)};
  Server first(lost), second(other);
  auto generator = MakeGenerator({first.Channel(), second.Channel()});
  const std::string before = TestTokenizer().Decode(std::vector<int32_t>{ids[0]});
  const std::string seam = TestTokenizer().Decode(std::vector<int32_t>{ids[1], ids[2]});
  ASSERT_GE(seam.size(), 2u);
  ferry::v1::GenerateRequest request = Request(8);
  request.mutable_sampling()->add_stop(seam);  // begins in the lost attempt's tokens, ends in the next
  CallHooks hooks;
  hooks.client_cancelled = [] { return false; };
  std::string text;
  GenerateChunk last;
  const Status status = generator->Run(request, hooks, [&](const GenerateChunk& c) {
    text += c.text();
    last = c;
    return true;
  });
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(text, before);
  EXPECT_EQ(last.finish_reason(), ferry::v1::FINISH_REASON_STOP);
  EXPECT_EQ(last.usage().completion_tokens(), 3);
}

// --migration-limit bounds the resumes: with 0 a lost replica ends a started request UNAVAILABLE,
// with a retry hint, and no other replica runs it.
TEST_F(GenerationCallTest, PastTheMigrationLimitALostReplicaEndsTheCallUnavailable) {
  ScriptedScheduler lost, other;
  lost.events = {Event({Ids("one")[0]})};
  lost.gap = 50ms;
  lost.after_events = grpc::Status(grpc::StatusCode::UNAVAILABLE, "scheduler lost");
  other.events = {Event({Ids("two")[0]}, ferry::v1::FINISH_KIND_EOS)};
  Server first(lost), second(other);
  auto generator = MakeGenerator({first.Channel(), second.Channel()}, 1, /*migration_limit=*/0);
  RecordingFront front;
  auto call = generator->NewCall(front.Hooks());
  call->Start(Request(8));
  ASSERT_TRUE(front.WaitChunks(1));
  call->WriteDone(true);
  const auto status = front.WaitDone();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), StatusCode::kUnavailable) << status->error_message();
  EXPECT_NE(status->error_message().find("--migration-limit 0"), std::string::npos) << status->error_message();
  EXPECT_EQ(status->retry_after_ms(), 1000);
  EXPECT_EQ(other.submits, 0);
  EXPECT_EQ(front.num_chunks(), 1u);
}

// Each loss is one migration: a request whose every scheduler is lost mid-stream ends after the limit.
TEST_F(GenerationCallTest, EveryLossCountsAgainstTheMigrationLimit) {
  const auto ids = Ids("one two three four");
  std::vector<std::unique_ptr<ScriptedScheduler>> schedulers;
  std::vector<std::unique_ptr<Server>> servers;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < 4; ++i) {
    schedulers.push_back(std::make_unique<ScriptedScheduler>());
    schedulers.back()->events = {Event({ids[static_cast<size_t>(i)]})};
    schedulers.back()->gap = 30ms;
    schedulers.back()->after_events = grpc::Status(grpc::StatusCode::UNAVAILABLE, "scheduler lost");
    servers.push_back(std::make_unique<Server>(*schedulers.back()));
    channels.push_back(servers.back()->Channel());
  }
  auto generator = MakeGenerator(channels, 1, /*migration_limit=*/2);
  CallHooks hooks;
  hooks.client_cancelled = [] { return false; };
  std::vector<int32_t> seen;
  const Status status = generator->Run(Request(8), hooks, [&](const GenerateChunk& c) {
    seen.insert(seen.end(), c.token_ids().begin(), c.token_ids().end());
    return true;
  });
  EXPECT_EQ(status.error_code(), StatusCode::kUnavailable) << status.error_message();
  EXPECT_EQ(seen.size(), 3u);  // three attempts: the first and two resumes, each one token
  int submits = 0;
  for (const auto& s : schedulers) submits += s->submits;
  EXPECT_EQ(submits, 3);
}

// Its only scheduler is away (restarting under its supervisor): the request waits in its lane and is
// served once the scheduler listens again on its address.
TEST_F(GenerationCallTest, ARequestNoReplicaTookWaitsForOneThatComesBack) {
  ScriptedScheduler scheduler;
  scheduler.events = {Event({Ids("one")[0]}, ferry::v1::FINISH_KIND_EOS)};
  int port = 0;
  {
    Server away(scheduler);  // only to learn a free port
    port = away.port;
  }
  auto generator = MakeGenerator({grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                      grpc::InsecureChannelCredentials())});
  RecordingFront front;
  auto call = generator->NewCall(front.Hooks());
  call->Start(Request(8));
  std::this_thread::sleep_for(700ms);
  EXPECT_FALSE(front.status_now().has_value());  // waiting, not failed
  Server back(scheduler, port);
  ASSERT_EQ(back.port, port);
  ASSERT_TRUE(front.WaitChunks(1));
  EXPECT_EQ(front.chunk(0).finish_reason(), ferry::v1::FINISH_REASON_EOS);
  call->WriteDone(true);
  const auto status = front.WaitDone();
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->ok()) << status->error_message();
  EXPECT_GE(num_attempts(), 2u);
}

// A replica that is up and refuses the request itself (its workers lost past their recovery
// timeout) has said its say: the call ends at once, UNAVAILABLE with the replica's retry hint.
TEST_F(GenerationCallTest, AReplicaThatRefusesItselfEndsTheCallAtOnceWithItsRetryHint) {
  ScriptedScheduler scheduler;
  TokenEvent refusal;
  refusal.set_status_code(static_cast<int32_t>(grpc::StatusCode::UNAVAILABLE));
  refusal.set_status_message("workers lost");
  refusal.set_retry_after_ms(1500);
  scheduler.events = {refusal};
  Server server(scheduler);
  auto generator = MakeGenerator({server.Channel()});
  RecordingFront front;
  int64_t retry_after_ms = 0;
  CallHooks hooks = front.Hooks();
  auto record = std::move(hooks.done);
  hooks.done = [&, record](Status status, int64_t retry) {
    retry_after_ms = retry;
    record(std::move(status), retry);
  };
  const auto start = std::chrono::steady_clock::now();
  auto call = generator->NewCall(std::move(hooks));
  call->Start(Request(8));
  const auto status = front.WaitDone();
  ASSERT_TRUE(status.has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_EQ(status->error_code(), StatusCode::kUnavailable) << status->error_message();
  EXPECT_EQ(retry_after_ms, 1500);
  EXPECT_EQ(status->retry_after_ms(), 1500);
  EXPECT_EQ(num_attempts(), 1u);
}

// The lane's queue timeout at the replica (overload) stays DEADLINE_EXCEEDED, marked as such, with
// the lane's retry hint and a message naming the lane and its limit, so HTTP can answer 429.
TEST_F(GenerationCallTest, AQueueTimeoutNamesTheLaneAndCarriesItsRetryHint) {
  ScriptedScheduler scheduler;
  TokenEvent expired;
  expired.set_status_code(static_cast<int32_t>(grpc::StatusCode::DEADLINE_EXCEEDED));
  expired.set_status_message("not started within its lane's queue timeout");
  expired.set_queue_timeout(true);
  scheduler.events = {expired};
  Server server(scheduler);
  auto generator = MakeGenerator({server.Channel()});
  RecordingFront front;
  auto call = generator->NewCall(front.Hooks());
  call->Start(Request(8));  // the default lane: interactive, 5 s queue timeout
  const auto status = front.WaitDone();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), StatusCode::kDeadlineExceeded) << status->error_message();
  EXPECT_TRUE(status->queue_timeout());
  EXPECT_EQ(status->retry_after_ms(), 500);
  EXPECT_NE(status->error_message().find("lane \"interactive\""), std::string::npos) << status->error_message();
  EXPECT_NE(status->error_message().find("queue timeout of 5000 ms"), std::string::npos) << status->error_message();
  EXPECT_EQ(front.num_chunks(), 0u);  // never started: no chunk, no TIMEOUT finish
}

TEST_F(GenerationCallTest, ARefusedRequestEndsBeforeStartReturnsWithoutAnAttempt) {
  ScriptedScheduler scheduler;
  Server server(scheduler);
  auto generator = MakeGenerator({server.Channel()});
  RecordingFront front;
  auto call = generator->NewCall(front.Hooks());
  call->Start(Request(1000));  // beyond max_model_len
  const auto status = front.status_now();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status->error_message().find("max_tokens"), std::string::npos) << status->error_message();
  EXPECT_EQ(num_attempts(), 0u);
  EXPECT_EQ(scheduler.submits, 0);
}

// --stream-interval 3: the first token goes at once, then chunks of three or more; nothing is lost.
TEST_F(GenerationCallTest, AStreamIntervalHoldsChunksUntilTheyHaveThatManyTokens) {
  ScriptedScheduler scheduler;
  const auto ids = Ids("one two three four five six seven eight");
  ASSERT_GE(ids.size(), 8u);
  for (size_t i = 0; i + 1 < 8; ++i) scheduler.events.push_back(Event({ids[i]}));
  scheduler.events.push_back(Event({ids[7]}, ferry::v1::FINISH_KIND_LENGTH));
  scheduler.gap = 10ms;
  Server server(scheduler);
  auto generator = MakeGenerator({server.Channel()}, 3);
  CallHooks hooks;
  hooks.client_cancelled = [] { return false; };
  std::vector<std::vector<int32_t>> chunks;
  const Status status = generator->Run(Request(8), hooks, [&](const GenerateChunk& c) {
    chunks.emplace_back(c.token_ids().begin(), c.token_ids().end());
    return true;
  });
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_GE(chunks.size(), 2u);
  EXPECT_EQ(chunks.front().size(), 1u);  // time to first token is not held back
  std::vector<int32_t> all;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (i > 0 && i + 1 < chunks.size()) EXPECT_GE(chunks[i].size(), 3u) << "chunk " << i;
    all.insert(all.end(), chunks[i].begin(), chunks[i].end());
  }
  EXPECT_EQ(all, std::vector<int32_t>(ids.begin(), ids.begin() + 8));
}

TEST_F(GenerationCallTest, ConcurrentCallsShareTheReplicasSession) {
  ScriptedScheduler scheduler;
  const auto ids = Ids("one two");
  scheduler.events = {Event({ids[0]}), Event({ids[1]}, ferry::v1::FINISH_KIND_EOS)};
  Server server(scheduler);
  auto generator = MakeGenerator({server.Channel()});
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      CallHooks hooks;
      hooks.client_cancelled = [] { return false; };
      std::vector<int32_t> seen;
      const Status status = generator->Run(Request(4), hooks, [&](const GenerateChunk& c) {
        seen.insert(seen.end(), c.token_ids().begin(), c.token_ids().end());
        return true;
      });
      ok += status.ok() && seen == std::vector<int32_t>{ids[0], ids[1]};
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok, 8);
  EXPECT_EQ(scheduler.submits, 8);
  EXPECT_EQ(scheduler.sessions, 1);
}

// A front cancels from its own thread while the call waits for the scheduler (a drain, a client
// that went away): the call ends, even though CancelSource holds its lock while it cancels.
TEST_F(GenerationCallTest, ACancelWhileTheCallWaitsEndsIt) {
  ScriptedScheduler scheduler;
  scheduler.events = {Event({Ids("one")[0]})};  // then silence
  Server server(scheduler);
  auto generator = MakeGenerator({server.Channel()});
  RecordingFront front;
  CancelSource cancel;
  CallHooks hooks = front.Hooks();
  hooks.cancel = &cancel;
  auto call = generator->NewCall(std::move(hooks));
  call->Start(Request(8));
  ASSERT_TRUE(front.WaitChunks(1));
  call->WriteDone(true);  // the call waits for the next event
  std::this_thread::sleep_for(50ms);
  cancel.Cancel();
  const auto status = front.WaitDone();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), StatusCode::kCancelled) << status->error_message();
  for (int i = 0; i < 200 && !scheduler.saw_cancel; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(scheduler.saw_cancel);
}

// A job cancelled while its lane was full runs its next call with a source already cancelled: the
// call ends at once and nothing reaches the scheduler.
TEST_F(GenerationCallTest, ACallWhoseSourceWasCancelledBeforeItStartedEndsAtOnce) {
  ScriptedScheduler scheduler;
  scheduler.events = {Event({Ids("one")[0]}, ferry::v1::FINISH_KIND_EOS)};
  Server server(scheduler);
  auto generator = MakeGenerator({server.Channel()});
  RecordingFront front;
  CancelSource cancel;
  cancel.Cancel();
  CallHooks hooks = front.Hooks();
  hooks.cancel = &cancel;
  auto call = generator->NewCall(std::move(hooks));
  call->Start(Request(8));
  const auto status = front.WaitDone();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), StatusCode::kCancelled) << status->error_message();
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(scheduler.submits, 0);
  EXPECT_EQ(front.num_chunks(), 0u);
}

// The scheduler ends a request by its timeout itself; one that does not answer is caught by the
// gateway's own timer, and the client gets what it had with finish "timeout".
TEST_F(GenerationCallTest, ADeadlineEndsTheCallWhenTheSchedulerDoesNot) {
  ScriptedScheduler scheduler;
  scheduler.events = {Event({Ids("one")[0]})};  // then silence
  Server server(scheduler);
  auto generator = MakeGenerator({server.Channel()});
  RecordingFront front;
  CallHooks hooks = front.Hooks();
  hooks.deadline = std::chrono::system_clock::now() + 300ms;
  auto call = generator->NewCall(std::move(hooks));
  call->Start(Request(8));
  ASSERT_TRUE(front.WaitChunks(1));
  call->WriteDone(true);
  ASSERT_TRUE(front.WaitChunks(2));
  EXPECT_EQ(front.chunk(1).finish_reason(), ferry::v1::FINISH_REASON_TIMEOUT);
  EXPECT_EQ(front.chunk(1).usage().completion_tokens(), 1);
  call->WriteDone(true);
  const auto status = front.WaitDone();
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->ok()) << status->error_message();
  for (int i = 0; i < 200 && !scheduler.saw_cancel; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(scheduler.saw_cancel);  // the scheduler is told to free the sequence
}

TEST_F(GenerationCallTest, BlockingRunDeliversEveryChunkInOrderOnTheCallersThread) {
  ScriptedScheduler scheduler;
  const auto ids = Ids("one two three four");
  ASSERT_GE(ids.size(), 4u);
  for (size_t i = 0; i + 1 < 4; ++i) scheduler.events.push_back(Event({ids[i]}));
  scheduler.events.push_back(Event({ids[3]}, ferry::v1::FINISH_KIND_LENGTH));
  Server server(scheduler);
  auto generator = MakeGenerator({server.Channel()});
  CallHooks hooks;
  hooks.client_cancelled = [] { return false; };
  const auto caller = std::this_thread::get_id();
  std::vector<int32_t> seen;
  bool same_thread = true;
  ferry::v1::FinishReason reason = ferry::v1::FINISH_REASON_UNSPECIFIED;
  const Status status = generator->Run(Request(4), hooks, [&](const GenerateChunk& c) {
    same_thread = same_thread && std::this_thread::get_id() == caller;
    seen.insert(seen.end(), c.token_ids().begin(), c.token_ids().end());
    if (c.finish_reason() != ferry::v1::FINISH_REASON_UNSPECIFIED) reason = c.finish_reason();
    return true;
  });
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(same_thread);
  EXPECT_EQ(seen, std::vector<int32_t>(ids.begin(), ids.begin() + 4));
  EXPECT_EQ(reason, ferry::v1::FINISH_REASON_LENGTH);
}

}  // namespace
}  // namespace ferry::gateway
