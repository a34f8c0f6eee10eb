// Proto -> domain translation of a step (ToStepSpec) and the step validation the engine backends
// share (ValidateStep), for guided decoding (structured output): carried as sent, refused by a
// backend without a matcher before any of the step applies. (The sim backend validates nothing;
// its Info reports no guided decoding, so the scheduler refuses such requests.)
#include "worker/worker_service.h"

#include <gtest/gtest.h>

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "worker/comm/communicator.h"
#include "worker/engine/step_validation.h"

namespace ferry::worker {
namespace {

// What ValidateStep reads of a runner's live sequence.
struct LiveSequence {
  std::vector<int32_t> token_ids;
  int32_t num_computed = 0;
  std::vector<int32_t> block_table;
};

ModelInfo Info(bool supports_guided_decoding) {
  ModelInfo info;
  info.vocab_size = 100;
  info.max_model_len = 64;
  info.block_size = 4;
  info.num_kv_blocks = 16;
  info.eos_token_ids = {2};
  info.supports_guided_decoding = supports_guided_decoding;
  return info;
}

// One new sequence of three prompt tokens, scheduled in full.
ferry::v1::StepRequest OneSequence(const ferry::v1::GuidedDecoding* guided) {
  ferry::v1::StepRequest request;
  request.set_step_id(1);
  auto* n = request.add_new_sequences();
  n->set_seq_id(5);
  for (int32_t t : {10, 11, 12}) n->add_token_ids(t);
  n->mutable_sampling()->set_temperature(0);
  n->mutable_sampling()->set_top_p(1);
  n->mutable_sampling()->set_repetition_penalty(1);
  if (guided != nullptr) *n->mutable_sampling()->mutable_guided() = *guided;
  auto* s = request.add_scheduled();
  s->set_seq_id(5);
  s->set_num_tokens(3);
  s->add_new_block_ids(0);
  return request;
}

// Empty when the step is valid for a backend, else the message it is refused with.
std::string Refusal(const StepSpec& step, bool supports_guided_decoding) {
  try {
    ValidateStep(step, Info(supports_guided_decoding), std::unordered_map<uint64_t, LiveSequence>{});
    return {};
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
}

TEST(ToStepSpec, CarriesGuidedDecoding) {
  ferry::v1::GuidedDecoding choice;
  choice.mutable_choice()->add_choices("yes");
  choice.mutable_choice()->add_choices("no");
  const StepSpec with_choice = ToStepSpec(OneSequence(&choice));
  ASSERT_EQ(with_choice.new_sequences.size(), 1u);
  const GuidedSpec& g = with_choice.new_sequences[0].sampling.guided;
  EXPECT_EQ(g.kind, GuidedSpec::Kind::kChoice);
  EXPECT_EQ(g.choices, (std::vector<std::string>{"yes", "no"}));

  ferry::v1::GuidedDecoding json_object;
  json_object.set_json_object(true);
  EXPECT_EQ(ToStepSpec(OneSequence(&json_object)).new_sequences[0].sampling.guided.kind,
            GuidedSpec::Kind::kJsonObject);
  EXPECT_EQ(ToStepSpec(OneSequence(nullptr)).new_sequences[0].sampling.guided.kind, GuidedSpec::Kind::kNone);
  const ferry::v1::GuidedDecoding no_kind;  // set, but neither constraint: unconstrained
  EXPECT_EQ(ToStepSpec(OneSequence(&no_kind)).new_sequences[0].sampling.guided.kind, GuidedSpec::Kind::kNone);

  ferry::v1::GuidedDecoding schema;
  schema.set_json_schema(R"({"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"string"}}})");
  const GuidedSpec s = ToStepSpec(OneSequence(&schema)).new_sequences[0].sampling.guided;
  EXPECT_EQ(s.kind, GuidedSpec::Kind::kJsonSchema);
  EXPECT_EQ(s.json_schema, schema.json_schema());  // as sent: the properties' order is the text's
  EXPECT_TRUE(s.choices.empty());

  ferry::v1::GuidedDecoding regex;
  regex.set_regex(R"((?:yes|no)-\d{2,4})");
  const GuidedSpec r = ToStepSpec(OneSequence(&regex)).new_sequences[0].sampling.guided;
  EXPECT_EQ(r.kind, GuidedSpec::Kind::kRegex);
  EXPECT_EQ(r.regex, regex.regex());
  EXPECT_TRUE(r.json_schema.empty());
  EXPECT_TRUE(r.choices.empty());
}

TEST(ValidateStep, GuidedDecodingNeedsABackendThatSupportsIt) {
  ferry::v1::GuidedDecoding json_object;
  json_object.set_json_object(true);
  const StepSpec step = ToStepSpec(OneSequence(&json_object));
  EXPECT_EQ(Refusal(step, false), "sequence 5: guided decoding is not supported by this backend");
  EXPECT_EQ(Refusal(step, true), "");
  EXPECT_EQ(Refusal(ToStepSpec(OneSequence(nullptr)), false), "");  // unconstrained runs anywhere
}

TEST(ValidateStep, AChoiceConstraintNeedsNonEmptyChoices) {
  StepSpec step = ToStepSpec(OneSequence(nullptr));
  GuidedSpec& g = step.new_sequences[0].sampling.guided;
  g.kind = GuidedSpec::Kind::kChoice;
  EXPECT_EQ(Refusal(step, true), "sequence 5: guided choice constraint has no choices");
  g.choices = {"a", ""};
  EXPECT_EQ(Refusal(step, true), "sequence 5: guided choice 1 is empty");
  g.choices = {"a", "b"};
  EXPECT_EQ(Refusal(step, true), "");
}

TEST(ValidateStep, AJsonSchemaMustCompile) {
  StepSpec step = ToStepSpec(OneSequence(nullptr));
  GuidedSpec& g = step.new_sequences[0].sampling.guided;
  g.kind = GuidedSpec::Kind::kJsonSchema;
  g.json_schema = R"({"type":"object","properties":{"age":{"type":"integer","multipleOf":2}}})";
  EXPECT_EQ(Refusal(step, true),
            "sequence 5: guided json_schema: schema at /properties/age: \"multipleOf\" is not supported");
  EXPECT_EQ(Refusal(step, false), "sequence 5: guided decoding is not supported by this backend");
  g.json_schema = "{not json";
  EXPECT_EQ(Refusal(step, true).rfind("sequence 5: guided json_schema: schema is not JSON", 0), 0u);
  g.json_schema = R"({"type":"object","properties":{"age":{"type":"integer"}},"required":["age"]})";
  EXPECT_EQ(Refusal(step, true), "");
}

TEST(ValidateStep, ARegexMustCompile) {
  StepSpec step = ToStepSpec(OneSequence(nullptr));
  GuidedSpec& g = step.new_sequences[0].sampling.guided;
  g.kind = GuidedSpec::Kind::kRegex;
  g.regex = R"(a\b)";
  EXPECT_EQ(Refusal(step, true), "sequence 5: guided regex: regex at byte 2: the escape \\b is not supported");
  EXPECT_EQ(Refusal(step, false), "sequence 5: guided decoding is not supported by this backend");
  g.regex = "(a";
  EXPECT_EQ(Refusal(step, true), "sequence 5: guided regex: regex at byte 2: missing ')'");
  g.regex = "[a-z]+@[a-z]+\\.com";
  EXPECT_EQ(Refusal(step, true), "");
}

// A runner whose Step blocks until released, or throws what it is told to.
class GateRunner final : public ModelRunner {
 public:
  GateRunner() {
    info_.tp_rank = 1;
    info_.tp_size = 2;
  }
  const ModelInfo& info() const override { return info_; }
  std::vector<SampledTokenOut> Step(const StepSpec&) override {
    if (!throw_comm_error_.empty()) throw CommError(throw_comm_error_);
    std::unique_lock lock(mutex_);
    released_.wait(lock, [&] { return is_released_; });
    return {};
  }
  void ForgetAll() override {}
  void Release() {
    std::lock_guard lock(mutex_);
    is_released_ = true;
    released_.notify_all();
  }
  void Close() {
    std::lock_guard lock(mutex_);
    is_released_ = false;
  }
  std::string throw_comm_error_;

 private:
  ModelInfo info_;
  std::mutex mutex_;
  std::condition_variable released_;
  bool is_released_ = false;
};

// The service on a kernel-chosen loopback port, with a client.
struct Served {
  Served(ModelRunner& runner, WorkerServiceOptions options) : service(runner, registry, std::move(options)) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    stub = ferry::v1::Worker::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                          grpc::InsecureChannelCredentials()));
  }
  ~Served() { server->Shutdown(); }

  ferry::v1::HealthResponse Health() {
    grpc::ClientContext context;
    ferry::v1::HealthResponse out;
    EXPECT_TRUE(stub->Health(&context, {}, &out).ok());
    return out;
  }

  prometheus::Registry registry;
  WorkerService service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<ferry::v1::Worker::Stub> stub;
};

ferry::v1::StepRequest EmptyStep(uint64_t step_id) {
  ferry::v1::StepRequest request;
  request.set_step_id(step_id);
  return request;
}

TEST(WorkerServiceHealth, TheFirstStepsGetFiveTimesTheStepTimeout) {
  GateRunner runner;
  Served served(runner, {.step_timeout_s = 1});
  grpc::ClientContext context;
  auto stream = served.stub->Step(&context);
  ASSERT_TRUE(stream->Write(EmptyStep(1)));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_TRUE(served.Health().ok()) << served.Health().reason();  // a first step: 5 s
  runner.Release();
  ferry::v1::StepResult result;
  ASSERT_TRUE(stream->Read(&result));
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST(WorkerServiceHealth, FailsWhileAStepRunsPastTheStepTimeout) {
  GateRunner runner;
  Served served(runner, {.step_timeout_s = 1});
  grpc::ClientContext context;
  auto stream = served.stub->Step(&context);
  runner.Release();  // the first steps (which get 5x) pass
  for (uint64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(stream->Write(EmptyStep(step)));
    ferry::v1::StepResult first;
    ASSERT_TRUE(stream->Read(&first));
  }
  runner.Close();
  ASSERT_TRUE(stream->Write(EmptyStep(7)));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(served.Health().ok());  // running, within the timeout
  EXPECT_GT(served.Health().step_running_s(), 0.2);  // a reconnecting scheduler waits for 0
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  const ferry::v1::HealthResponse late = served.Health();
  EXPECT_FALSE(late.ok());
  EXPECT_NE(late.incarnation_id(), 0u);
  EXPECT_TRUE(late.reason().starts_with("step 7 running for 1.")) << late.reason();
  EXPECT_TRUE(late.reason().ends_with(" s, over 1 s (--step-timeout-s 1)")) << late.reason();
  EXPECT_EQ(served.service.HealthProblem().substr(0, 20), late.reason().substr(0, 20));  // grpc.health's view

  runner.Release();  // the step finishes: nothing is wrong any more
  ferry::v1::StepResult result;
  ASSERT_TRUE(stream->Read(&result));
  EXPECT_EQ(result.step_id(), 7u);
  EXPECT_EQ(result.error(), "");
  EXPECT_TRUE(served.Health().ok());
  EXPECT_EQ(served.Health().step_running_s(), 0.0);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST(WorkerServiceHealth, NoStepTimeoutByDefault) {
  GateRunner runner;
  Served served(runner, {});
  grpc::ClientContext context;
  auto stream = served.stub->Step(&context);
  ASSERT_TRUE(stream->Write(EmptyStep(1)));
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  EXPECT_TRUE(served.Health().ok());
  runner.Release();
  ferry::v1::StepResult result;
  ASSERT_TRUE(stream->Read(&result));
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST(WorkerServiceHealth, ABrokenGroupFailsHealthAndCallsTheHook) {
  GateRunner runner;
  runner.throw_comm_error_ = "Gloo AllReduceSum (rank 1 of 2, timeout 3000 ms): Timed out";
  std::vector<std::string> reasons;
  Served served(runner, {.on_group_failure = [&](const std::string& reason) { reasons.push_back(reason); }});
  EXPECT_TRUE(served.Health().ok());
  grpc::ClientContext context;
  auto stream = served.stub->Step(&context);
  ASSERT_TRUE(stream->Write(EmptyStep(3)));
  ferry::v1::StepResult result;
  ASSERT_TRUE(stream->Read(&result));  // the hook returned (ferry-worker's exits instead)
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_EQ(reasons[0], "tensor-parallel rank 1 of 2 lost its group in step 3: " + runner.throw_comm_error_);
  EXPECT_EQ(result.error(), reasons[0]);
  const ferry::v1::HealthResponse health = served.Health();
  EXPECT_FALSE(health.ok());
  EXPECT_EQ(health.reason(), reasons[0]);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

// A runner that keeps each step it is given and samples token 7 for every scheduled sequence.
class RecordingRunner final : public ModelRunner {
 public:
  const ModelInfo& info() const override { return info_; }
  std::vector<SampledTokenOut> Step(const StepSpec& step) override {
    steps.push_back(step);
    std::vector<SampledTokenOut> out;
    for (const ScheduledSpec& s : step.scheduled) out.push_back({.seq_id = s.seq_id, .token_id = 7});
    return out;
  }
  void ForgetAll() override {}
  std::vector<StepSpec> steps;

 private:
  ModelInfo info_ = Info(false);
};

std::vector<uint64_t> ScheduledIds(const StepSpec& step) {
  std::vector<uint64_t> ids;
  for (const ScheduledSpec& s : step.scheduled) ids.push_back(s.seq_id);
  return ids;
}

// One bad sequence is refused alone (#54): the rest of its step runs, the refusal names the sequence and
// why, a second step in flight that still schedules it skips it, and once the scheduler's finished_ids
// names it the worker forgets it.
TEST(WorkerServiceSteps, OneBadSequenceIsRefusedAloneAndTheRestOfItsStepRuns) {
  RecordingRunner runner;
  Served served(runner, {});
  grpc::ClientContext context;
  auto stream = served.stub->Step(&context);
  ferry::v1::StepRequest first = OneSequence(nullptr);
  auto* bad = first.add_new_sequences();
  *bad = first.new_sequences(0);
  bad->set_seq_id(6);
  bad->set_token_ids(1, 150);  // outside the vocabulary of 100
  auto* s = first.add_scheduled();
  s->set_seq_id(6);
  s->set_num_tokens(3);
  s->add_new_block_ids(1);
  ferry::v1::StepResult result;
  ASSERT_TRUE(stream->Write(first) && stream->Read(&result));
  EXPECT_EQ(result.error(), "");
  ASSERT_EQ(result.sequence_errors_size(), 1);
  EXPECT_EQ(result.sequence_errors(0).seq_id(), 6u);
  EXPECT_EQ(result.sequence_errors(0).message(), "sequence 6: token id 150 outside vocab of 100");
  ASSERT_EQ(result.sampled_size(), 1);
  EXPECT_EQ(result.sampled(0).seq_id(), 5u);
  // The second step, planned before the scheduler heard: both scheduled again; only 5 reaches the runner.
  ferry::v1::StepRequest second = EmptyStep(2);
  for (uint64_t id : {5, 6}) {
    auto* decode = second.add_scheduled();
    decode->set_seq_id(id);
    decode->set_num_tokens(1);
  }
  ASSERT_TRUE(stream->Write(second) && stream->Read(&result));
  EXPECT_EQ(result.error(), "");
  EXPECT_EQ(result.sequence_errors_size(), 0);
  // The scheduler ended it: its finished id is the worker's cue to forget it, and is not the runner's.
  ferry::v1::StepRequest third = EmptyStep(3);
  third.add_finished_ids(6);
  ASSERT_TRUE(stream->Write(third) && stream->Read(&result));
  ferry::v1::StepRequest fourth = EmptyStep(4);
  fourth.add_scheduled()->set_seq_id(6);
  ASSERT_TRUE(stream->Write(fourth) && stream->Read(&result));
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  ASSERT_EQ(runner.steps.size(), 4u);
  ASSERT_EQ(runner.steps[0].new_sequences.size(), 1u);
  EXPECT_EQ(runner.steps[0].new_sequences[0].seq_id, 5u);
  EXPECT_EQ(ScheduledIds(runner.steps[0]), std::vector<uint64_t>{5});
  EXPECT_EQ(ScheduledIds(runner.steps[1]), std::vector<uint64_t>{5});
  EXPECT_TRUE(runner.steps[2].finished_ids.empty());
  EXPECT_EQ(ScheduledIds(runner.steps[3]), std::vector<uint64_t>{6}) << "forgotten: no longer screened out";
}

}  // namespace
}  // namespace ferry::worker
