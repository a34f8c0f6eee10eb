// The Session adapter over a real engine loop and a fake worker group, through a gRPC server on
// loopback: many requests share a session and its messages, a cancel or the session's end frees
// their sequences, guided decoding (structured output) reaches the worker's NewSequence, and a
// replica whose workers cannot constrain refuses it before it is queued.
#include "scheduler/scheduler_service.h"

#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "scheduler/worker_client.h"

namespace ferry::scheduler {
namespace {

using namespace std::chrono_literals;

// Samples token 7 whenever a sequence's known tokens are all computed; keeps every NewSequence
// as the worker would receive it (ToStepRequest).
class RecordingWorkers : public WorkerGroup {
 public:
  void Send(uint64_t step_id, const StepPlan& plan) override {
    const ferry::v1::StepRequest request = ToStepRequest(step_id, plan);
    std::lock_guard lock(mu_);
    new_sequences_.insert(new_sequences_.end(), request.new_sequences().begin(), request.new_sequences().end());
    sent_.push_back(plan);
  }
  void Receive(StepOutput& output) override {
    if (step_delay.count() > 0) std::this_thread::sleep_for(step_delay);
    const StepPlan plan = std::move(sent_.front());
    sent_.pop_front();
    for (uint64_t id : plan.finished_ids) seqs_.erase(id);
    for (uint64_t id : plan.preempted_ids) seqs_.erase(id);
    for (const auto& n : plan.new_sequences) seqs_[n.seq_id] = {static_cast<int32_t>(n.token_ids.size()), 0};
    StepOutput out;
    for (const auto& s : plan.scheduled) {
      Seq& seq = seqs_.at(s.seq_id);
      seq.computed += s.num_tokens;
      if (seq.computed < seq.known) continue;
      ++seq.known;
      out.sampled.push_back({s.seq_id, 7});
    }
    output = std::move(out);
  }
  std::vector<ferry::v1::NewSequence> new_sequences() {
    std::lock_guard lock(mu_);
    return new_sequences_;
  }
  std::chrono::milliseconds step_delay{0};  // set before the loop starts

 private:
  struct Seq {
    int32_t known = 0;
    int32_t computed = 0;
  };
  std::deque<StepPlan> sent_;     // loop thread only
  std::map<uint64_t, Seq> seqs_;  // loop thread only
  std::mutex mu_;                 // guards new_sequences_, read by the test thread
  std::vector<ferry::v1::NewSequence> new_sequences_;
};

SchedulerConfig Config() {
  SchedulerConfig c;
  c.max_num_seqs = 4;
  c.max_num_batched_tokens = 64;
  c.max_model_len = 128;
  c.block_size = 4;
  c.num_kv_blocks = 32;
  return c;
}

class SchedulerServiceTest : public ::testing::Test {
 protected:
  void Start(bool supports_guided_decoding) {
    ferry::v1::SchedulerInfo info;
    info.set_max_model_len(128);
    info.set_vocab_size(100);
    info.set_supports_guided_decoding(supports_guided_decoding);
    loop_ = std::make_unique<EngineLoop>(Config(), workers_, registry_);
    service_ = std::make_unique<SchedulerService>(*loop_, info);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    stub_ = ferry::v1::Scheduler::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  }
  ~SchedulerServiceTest() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + 1s);
  }

  using Session = grpc::ClientReaderWriter<ferry::v1::SessionRequests, ferry::v1::SessionEvents>;

  static void Send(Session& session, const std::vector<ferry::v1::SubmitRequest>& requests, uint64_t first_id = 1) {
    ferry::v1::SessionRequests out;
    for (size_t i = 0; i < requests.size(); ++i) {
      auto* submit = out.add_submits();
      submit->set_stream_id(first_id + i);
      *submit->mutable_request() = requests[i];
    }
    ASSERT_TRUE(session.Write(out));
  }

  // Reads until each of `ids` has ended; its status per id (from status_code, or OK with a
  // finish), its tokens, and how many messages carried them.
  struct Ends {
    std::map<uint64_t, grpc::Status> status;
    std::map<uint64_t, std::vector<int32_t>> tokens;
    int messages = 0;
    int shared_messages = 0;  // messages carrying events of two or more requests
  };
  static Ends ReadUntilEnded(Session& session, size_t count) {
    Ends ends;
    ferry::v1::SessionEvents in;
    while (ends.status.size() < count && session.Read(&in)) {
      ++ends.messages;
      std::set<uint64_t> ids;
      for (const ferry::v1::TokenEvent& e : in.events()) {
        ids.insert(e.stream_id());
        auto& tokens = ends.tokens[e.stream_id()];
        tokens.insert(tokens.end(), e.token_ids().begin(), e.token_ids().end());
        if (e.status_code() != 0) {
          ends.status[e.stream_id()] = grpc::Status(static_cast<grpc::StatusCode>(e.status_code()), e.status_message());
        } else if (e.finish() != ferry::v1::FINISH_KIND_NONE) {
          ends.status[e.stream_id()] = grpc::Status::OK;
        }
      }
      ends.shared_messages += ids.size() >= 2;
    }
    return ends;
  }

  // Runs the request to its end on a session of its own, closed (half) once sent; returns its status.
  grpc::Status Submit(const ferry::v1::SubmitRequest& request) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 10s);
    auto session = stub_->Session(&context);
    Send(*session, {request});
    session->WritesDone();  // closed at once: the session still serves the request, then ends
    const Ends ends = ReadUntilEnded(*session, 1);
    ferry::v1::SessionEvents after;
    EXPECT_FALSE(session->Read(&after));
    EXPECT_TRUE(session->Finish().ok());
    if (!ends.status.count(1)) return grpc::Status(grpc::StatusCode::UNKNOWN, "the session ended first");
    return ends.status.at(1);
  }

  double Finished(const std::string& reason) {
    for (const auto& family : registry_.Collect()) {
      if (family.name != "ferry_scheduler_requests_finished_total") continue;
      for (const auto& metric : family.metric) {
        for (const auto& label : metric.label) {
          if (label.name == "reason" && label.value == reason) return metric.counter.value;
        }
      }
    }
    return 0;
  }

  static ferry::v1::SubmitRequest Request() {
    ferry::v1::SubmitRequest r;
    r.set_request_id("r");
    for (int32_t t : {11, 12, 13}) r.add_prompt_token_ids(t);
    r.mutable_sampling()->set_max_tokens(2);
    return r;
  }

  prometheus::Registry registry_;
  RecordingWorkers workers_;
  std::unique_ptr<EngineLoop> loop_;
  std::unique_ptr<SchedulerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<ferry::v1::Scheduler::Stub> stub_;
};

TEST_F(SchedulerServiceTest, ManyRequestsShareOneSessionAndItsMessages) {
  // Steps of 2 ms: the four run together for 40 ms however late a loaded machine lets the loop
  // see the last of them.
  workers_.step_delay = 2ms;
  Start(false);
  grpc::ClientContext context;
  auto session = stub_->Session(&context);
  std::vector<ferry::v1::SubmitRequest> requests(4, Request());
  for (auto& r : requests) r.mutable_sampling()->set_max_tokens(20);
  Send(*session, requests);
  const Ends ends = ReadUntilEnded(*session, 4);
  ASSERT_EQ(ends.status.size(), 4u);
  for (uint64_t id = 1; id <= 4; ++id) {
    EXPECT_TRUE(ends.status.at(id).ok()) << id << ": " << ends.status.at(id).error_message();
    EXPECT_EQ(ends.tokens.at(id), std::vector<int32_t>(20, 7)) << id;
  }
  // 80 tokens of four requests that run together: a message carries a step's events of all.
  EXPECT_GT(ends.shared_messages, 0);
  EXPECT_LT(ends.messages, 80);
  // The session stays open for more.
  Send(*session, {Request()}, 9);
  EXPECT_TRUE(ReadUntilEnded(*session, 1).status.at(9).ok());
  session->WritesDone();
  EXPECT_TRUE(session->Finish().ok());
  EXPECT_EQ(loop_->num_live(), 0);
}

TEST_F(SchedulerServiceTest, ACancelOrTheSessionsEndFreesTheSequence) {
  workers_.step_delay = 5ms;  // 120 tokens take 600 ms or more: the cancels land first
  Start(false);
  ferry::v1::SubmitRequest r = Request();
  r.mutable_sampling()->set_max_tokens(120);
  {
    grpc::ClientContext context;
    auto session = stub_->Session(&context);
    Send(*session, {r, r});
    ferry::v1::SessionEvents in;
    ASSERT_TRUE(session->Read(&in));  // started
    ferry::v1::SessionRequests cancel;
    cancel.add_cancels(1);
    cancel.add_cancels(77);  // unknown: ignored
    ASSERT_TRUE(session->Write(cancel));
    for (int i = 0; i < 500 && Finished("cancelled") < 1; ++i) std::this_thread::sleep_for(2ms);
    EXPECT_EQ(Finished("cancelled"), 1);
    // Stream 2 runs on; the session's end cancels it.
    context.TryCancel();
  }
  for (int i = 0; i < 500 && loop_->num_live() > 0; ++i) std::this_thread::sleep_for(2ms);
  EXPECT_EQ(loop_->num_live(), 0);
  EXPECT_EQ(Finished("cancelled"), 2);
  EXPECT_EQ(Finished("length"), 0);
}

// Issue #58: a request with an idempotency key that finished is answered again from its record
// (the same tokens) without reaching the engine; the key with another request is refused naming
// it; a keyed request cut off before its end leaves no record, so the next one runs.
TEST_F(SchedulerServiceTest, AKeyedRequestThatFinishedIsAnsweredFromItsRecord) {
  workers_.step_delay = 1ms;
  Start(false);
  auto run = [&](const ferry::v1::SubmitRequest& request) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 10s);
    auto session = stub_->Session(&context);
    Send(*session, {request});
    session->WritesDone();
    Ends ends = ReadUntilEnded(*session, 1);
    EXPECT_TRUE(session->Finish().ok());
    return ends;
  };
  ferry::v1::SubmitRequest r = Request();
  r.set_idempotency_key("4:acme:line-1");
  r.mutable_sampling()->set_max_tokens(5);
  const Ends first = run(r);
  ASSERT_TRUE(first.status.at(1).ok()) << first.status.at(1).error_message();
  ASSERT_EQ(first.tokens.at(1).size(), 5u);
  EXPECT_EQ(Finished("length"), 1);

  r.set_request_id("the same line, run again by another gateway");
  const Ends again = run(r);
  ASSERT_TRUE(again.status.at(1).ok()) << again.status.at(1).error_message();
  EXPECT_EQ(again.tokens.at(1), first.tokens.at(1));
  EXPECT_EQ(Finished("length"), 1) << "answered from the record: the engine never saw it";

  ferry::v1::SubmitRequest other = r;
  other.mutable_sampling()->set_max_tokens(6);
  const grpc::Status refused = run(other).status.at(1);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.error_message().find("idempotency_key"), std::string::npos) << refused.error_message();

  ferry::v1::SubmitRequest cut = Request();
  cut.set_idempotency_key("4:acme:line-2");
  cut.mutable_sampling()->set_max_tokens(120);
  {
    grpc::ClientContext context;
    auto session = stub_->Session(&context);
    Send(*session, {cut});
    ferry::v1::SessionEvents in;
    ASSERT_TRUE(session->Read(&in));  // started
    context.TryCancel();              // its gateway is gone
  }
  for (int i = 0; i < 500 && Finished("cancelled") < 1; ++i) std::this_thread::sleep_for(2ms);
  ASSERT_EQ(Finished("cancelled"), 1);
  const Ends rerun = run(cut);
  ASSERT_TRUE(rerun.status.at(1).ok());
  EXPECT_EQ(rerun.tokens.at(1).size(), 120u);
  EXPECT_EQ(Finished("length"), 2) << "a request cut off runs again";
}

TEST_F(SchedulerServiceTest, ABadSubmitIsRefusedAloneNamingTheField) {
  Start(false);
  grpc::ClientContext context;
  auto session = stub_->Session(&context);
  ferry::v1::SessionRequests out;
  auto* negative = out.add_submits();
  negative->set_stream_id(1);
  *negative->mutable_request() = Request();
  negative->set_timeout_ms(-5);
  auto* too_long = out.add_submits();
  too_long->set_stream_id(2);
  *too_long->mutable_request() = Request();
  too_long->mutable_request()->mutable_sampling()->set_max_tokens(1000);
  auto* fine = out.add_submits();
  fine->set_stream_id(3);
  *fine->mutable_request() = Request();
  ASSERT_TRUE(session->Write(out));
  const Ends ends = ReadUntilEnded(*session, 3);
  EXPECT_EQ(ends.status.at(1).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(ends.status.at(1).error_message(), "timeout_ms = -5 must be >= 0");
  EXPECT_EQ(ends.status.at(2).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(ends.status.at(2).error_message().find("max_model_len"), std::string::npos)
      << ends.status.at(2).error_message();
  EXPECT_TRUE(ends.status.at(3).ok()) << ends.status.at(3).error_message();
  EXPECT_EQ(ends.tokens.at(3), std::vector<int32_t>(2, 7));
  session->WritesDone();
  EXPECT_TRUE(session->Finish().ok());
}

// Two live requests of one id would make every later event ambiguous: the session ends.
TEST_F(SchedulerServiceTest, AStreamIdReusedWhileLiveEndsTheSession) {
  workers_.step_delay = 5ms;  // the first of id 1 is live for 500 ms
  Start(false);
  grpc::ClientContext context;
  auto session = stub_->Session(&context);
  ferry::v1::SubmitRequest r = Request();
  r.mutable_sampling()->set_max_tokens(100);
  Send(*session, {r});
  Send(*session, {r});  // id 1 again
  ferry::v1::SessionEvents in;
  while (session->Read(&in)) {
  }
  const grpc::Status status = session->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "stream_id = 1 is already live on this session");
  for (int i = 0; i < 500 && loop_->num_live() > 0; ++i) std::this_thread::sleep_for(2ms);
  EXPECT_EQ(loop_->num_live(), 0);
}

TEST_F(SchedulerServiceTest, ATimeoutEndsTheRequestWithTheTokensItHas) {
  workers_.step_delay = 5ms;
  Start(false);
  grpc::ClientContext context;
  auto session = stub_->Session(&context);
  ferry::v1::SessionRequests out;
  auto* submit = out.add_submits();
  submit->set_stream_id(1);
  *submit->mutable_request() = Request();
  submit->mutable_request()->mutable_sampling()->set_max_tokens(100);
  submit->set_timeout_ms(300);
  ASSERT_TRUE(session->Write(out));
  ferry::v1::SessionEvents in;
  ferry::v1::FinishKind finish = ferry::v1::FINISH_KIND_NONE;
  int tokens = 0, status_code = 0;
  while (finish == ferry::v1::FINISH_KIND_NONE && status_code == 0 && session->Read(&in)) {
    for (const auto& e : in.events()) {
      tokens += e.token_ids_size();
      finish = e.finish();
      status_code = e.status_code();
    }
  }
  EXPECT_EQ(status_code, 0);
  EXPECT_EQ(finish, ferry::v1::FINISH_KIND_TIMEOUT);
  EXPECT_GT(tokens, 0);
  EXPECT_LT(tokens, 100);
  session->WritesDone();
  EXPECT_TRUE(session->Finish().ok());
}

// SIGTERM: a session serves what it has, refuses new requests so that the gateway tries another
// replica, and ends once empty; an idle one ends at once.
TEST_F(SchedulerServiceTest, ADrainFinishesTheSessionsRequestsAndRefusesNewOnes) {
  workers_.step_delay = 5ms;  // the request is live for 300 ms: the drain and the late submit land first
  Start(false);
  grpc::ClientContext idle_context, busy_context;
  auto idle = stub_->Session(&idle_context);
  auto busy = stub_->Session(&busy_context);
  ferry::v1::SubmitRequest r = Request();
  r.mutable_sampling()->set_max_tokens(60);
  Send(*busy, {r});
  ferry::v1::SessionEvents in;
  ASSERT_TRUE(busy->Read(&in));  // started
  int tokens = 0;
  for (const auto& e : in.events()) tokens += e.token_ids_size();
  service_->Drain();
  EXPECT_FALSE(idle->Read(&in));
  EXPECT_TRUE(idle->Finish().ok());
  Send(*busy, {Request()}, 2);
  std::map<uint64_t, grpc::Status> ends;
  while (busy->Read(&in)) {
    for (const auto& e : in.events()) {
      if (e.stream_id() == 1) tokens += e.token_ids_size();
      if (e.status_code() != 0) {
        ends[e.stream_id()] = grpc::Status(static_cast<grpc::StatusCode>(e.status_code()), e.status_message());
      } else if (e.finish() != ferry::v1::FINISH_KIND_NONE) {
        ends[e.stream_id()] = grpc::Status::OK;
      }
    }
  }
  EXPECT_TRUE(busy->Finish().ok());
  ASSERT_EQ(ends.size(), 2u);
  EXPECT_TRUE(ends.at(1).ok());
  EXPECT_EQ(tokens, 60);  // all of them
  EXPECT_EQ(ends.at(2).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ends.at(2).error_message(), "the scheduler is draining; submit to another replica");
}

TEST_F(SchedulerServiceTest, GuidedDecodingReachesTheWorker) {
  Start(true);
  ferry::v1::SubmitRequest choice = Request();
  choice.mutable_sampling()->mutable_guided()->mutable_choice()->add_choices("yes");
  choice.mutable_sampling()->mutable_guided()->mutable_choice()->add_choices("no");
  ASSERT_TRUE(Submit(choice).ok());
  ferry::v1::SubmitRequest json_object = Request();
  json_object.mutable_sampling()->mutable_guided()->set_json_object(true);
  ASSERT_TRUE(Submit(json_object).ok());
  ASSERT_TRUE(Submit(Request()).ok());
  ferry::v1::SubmitRequest schema = Request();
  const std::string text = R"({"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"string"}}})";
  schema.mutable_sampling()->mutable_guided()->set_json_schema(text);
  ASSERT_TRUE(Submit(schema).ok());
  ferry::v1::SubmitRequest regex = Request();
  const std::string pattern = R"((?:yes|no)-\d{2,4})";
  regex.mutable_sampling()->mutable_guided()->set_regex(pattern);
  ASSERT_TRUE(Submit(regex).ok());
  ferry::v1::SubmitRequest grammar = Request();
  grammar.mutable_sampling()->mutable_guided()->set_grammar("root ::= (\"yes\" | \"no\") \"-\" [0-9]{2,4}");
  ASSERT_TRUE(Submit(grammar).ok());
  ferry::v1::SubmitRequest recursive = Request();
  const std::string nested = "root ::= \"(\" root \")\" | \"x\"";
  recursive.mutable_sampling()->mutable_guided()->set_grammar(nested);
  ASSERT_TRUE(Submit(recursive).ok());

  const std::vector<ferry::v1::NewSequence> sent = workers_.new_sequences();
  ASSERT_EQ(sent.size(), 7u);
  ASSERT_TRUE(sent[0].sampling().guided().has_choice());
  EXPECT_EQ(sent[0].sampling().guided().choice().choices_size(), 2);
  EXPECT_EQ(sent[0].sampling().guided().choice().choices(1), "no");
  EXPECT_TRUE(sent[1].sampling().guided().json_object());
  EXPECT_FALSE(sent[2].sampling().has_guided());  // unconstrained: nothing on the wire
  ASSERT_TRUE(sent[3].sampling().guided().has_json_schema());
  EXPECT_EQ(sent[3].sampling().guided().json_schema(), text);  // byte for byte: the properties' order is the text's
  ASSERT_TRUE(sent[4].sampling().guided().has_regex());
  EXPECT_EQ(sent[4].sampling().guided().regex(), pattern);
  // A grammar reaches the worker as itself, regular or not: the worker's matcher chooses between
  // the regex's DFA and the pushdown automaton (guided_decoding_test.cc).
  ASSERT_TRUE(sent[5].sampling().guided().has_grammar());
  EXPECT_EQ(sent[5].sampling().guided().grammar(), "root ::= (\"yes\" | \"no\") \"-\" [0-9]{2,4}");
  ASSERT_TRUE(sent[6].sampling().guided().has_grammar());
  EXPECT_EQ(sent[6].sampling().guided().grammar(), nested);
}

TEST_F(SchedulerServiceTest, AReplicaWithoutGuidedDecodingRefusesIt) {
  Start(false);
  ferry::v1::SubmitRequest r = Request();
  r.mutable_sampling()->mutable_guided()->set_json_object(true);
  const grpc::Status status = Submit(r);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "guided decoding is not supported by this replica's worker backend");
  EXPECT_TRUE(Submit(Request()).ok());  // an unconstrained request still runs
  EXPECT_EQ(workers_.new_sequences().size(), 1u);
}

TEST_F(SchedulerServiceTest, AChoiceConstraintWithoutChoicesIsRefused) {
  Start(true);
  ferry::v1::SubmitRequest r = Request();
  r.mutable_sampling()->mutable_guided()->mutable_choice();
  const grpc::Status status = Submit(r);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "guided.choice.choices (count) = 0 must be at least 1");
  EXPECT_TRUE(workers_.new_sequences().empty());
}

// The scheduler compiles no constraint (#54): a schema, a grammar or a regex that does not compile (only a client
// calling the scheduler directly can send one: the gateway checks them) goes to the workers as it came, and the
// worker refuses that sequence alone (WorkerServiceSteps.OneBadSequenceIsRefusedAloneAndTheRestOfItsStepRuns;
// end to end: test_e2e_guided_decoding.py's test_a_constraint_the_worker_cannot_compile_fails_alone).
TEST_F(SchedulerServiceTest, AConstraintIsCompiledByTheWorkersNotTheScheduler) {
  Start(true);
  std::vector<ferry::v1::SubmitRequest> requests(4, Request());
  requests[0].mutable_sampling()->mutable_guided()->set_json_schema(R"({"type":"integer","multipleOf":3})");
  requests[1].mutable_sampling()->mutable_guided()->set_json_schema("[1, 2");
  requests[2].mutable_sampling()->mutable_guided()->set_grammar("root ::= \"x\" | root \"+\" \"x\"");
  requests[3].mutable_sampling()->mutable_guided()->set_regex(R"((a)\1)");
  for (const ferry::v1::SubmitRequest& r : requests) EXPECT_TRUE(Submit(r).ok());
  const auto sent = workers_.new_sequences();
  ASSERT_EQ(sent.size(), 4u);
  EXPECT_EQ(sent[0].sampling().guided().json_schema(), R"({"type":"integer","multipleOf":3})");
  EXPECT_EQ(sent[3].sampling().guided().regex(), R"((a)\1)");
}

}  // namespace
}  // namespace ferry::scheduler
