// The worker's overlapped step path (ModelRunner::Submit / Collect), over real gRPC on loopback,
// with the sim backend's overlapping runner (--sim-overlap): a step sent before the previous
// one's answer (the scheduler's async scheduling) is submitted while that one runs; answers come
// in order, with the tokens the plain path gives; a step refused in the middle is answered with
// its error in its place; a stream that ends with steps outstanding leaves nothing behind.
#include <gtest/gtest.h>

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "worker/arch/random_checkpoint.h"
#include "worker/sim_runner.h"
#include "worker/worker_service.h"

namespace ferry::worker {
namespace {

namespace fs = std::filesystem;

class SimModel {
 public:
  SimModel() : dir_(fs::temp_directory_path() / ("ferry_overlap_" + std::to_string(::getpid()))) {
    WriteRandomCheckpoint(TinyShape(), 1, "bfloat16", dir_.string(), {});
  }
  ~SimModel() { fs::remove_all(dir_); }
  SimOptions Options(bool overlap, double step_s) const {
    SimOptions o;
    o.model_dir = dir_.string();
    o.cost.name = "fixed";
    o.cost.fixed_s = step_s;
    o.num_kv_blocks = 64;
    o.overlap = overlap;
    return o;
  }

 private:
  fs::path dir_;
};

struct Served {
  explicit Served(ModelRunner& runner) : service(runner, registry) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    stub = ferry::v1::Worker::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                          grpc::InsecureChannelCredentials()));
  }
  ~Served() { server->Shutdown(); }
  double StepRunningSeconds() {
    grpc::ClientContext context;
    ferry::v1::HealthResponse out;
    EXPECT_TRUE(stub->Health(&context, {}, &out).ok());
    return out.step_running_s();
  }

  prometheus::Registry registry;
  WorkerService service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<ferry::v1::Worker::Stub> stub;
};

// Step 1 prefills sequences 1..n (4 prompt tokens each, one block); each later step decodes them
// all (a fifth block-free token up to 16 tokens per block).
ferry::v1::StepRequest Step(uint64_t step_id, int n) {
  ferry::v1::StepRequest r;
  r.set_step_id(step_id);
  for (int s = 1; s <= n; ++s) {
    if (step_id == 1) {
      auto* seq = r.add_new_sequences();
      seq->set_seq_id(s);
      for (int t = 0; t < 4; ++t) seq->add_token_ids(10 * s + t);
    }
    auto* sched = r.add_scheduled();
    sched->set_seq_id(s);
    sched->set_num_tokens(step_id == 1 ? 4 : 1);
    if (step_id == 1) sched->add_new_block_ids(s - 1);
  }
  return r;
}

// Sends `steps` keeping `depth` steps unanswered at most (the scheduler's async scheduling: 2),
// and returns the answers in the order they came.
std::vector<ferry::v1::StepResult> Drive(Served& served, const std::vector<ferry::v1::StepRequest>& steps, int depth) {
  grpc::ClientContext context;
  auto stream = served.stub->Step(&context);
  std::vector<ferry::v1::StepResult> answers;
  size_t sent = 0;
  while (answers.size() < steps.size()) {
    while (sent < steps.size() && sent - answers.size() < static_cast<size_t>(depth)) {
      EXPECT_TRUE(stream->Write(steps[sent++]));
    }
    ferry::v1::StepResult result;
    if (!stream->Read(&result)) break;
    answers.push_back(result);
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  return answers;
}

std::vector<std::vector<int32_t>> Tokens(const std::vector<ferry::v1::StepResult>& answers) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& a : answers) {
    std::vector<int32_t>& row = out.emplace_back();
    for (const auto& s : a.sampled()) row.push_back(static_cast<int32_t>(s.seq_id() * 100000 + s.token_id()));
  }
  return out;
}

TEST(WorkerServiceOverlap, PipelinedStepsAnswerInOrderWithThePlainPathsTokens) {
  SimModel model;
  std::vector<ferry::v1::StepRequest> steps;
  for (uint64_t i = 1; i <= 8; ++i) steps.push_back(Step(i, 3));
  SimRunner plain_runner(model.Options(false, 0.002));
  Served plain(plain_runner);
  const auto want = Drive(plain, steps, 1);
  SimRunner overlap_runner(model.Options(true, 0.02));
  ASSERT_TRUE(overlap_runner.supports_overlap());
  Served overlapped(overlap_runner);
  const auto start = std::chrono::steady_clock::now();
  const auto got = Drive(overlapped, steps, 2);
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // A step's execute time starts when the one before it ended, not when it was submitted behind
  // it: the steps' times are disjoint slices of the run, so they add up to no more than it.
  double execute_s = 0;
  for (const auto& r : got) execute_s += r.execute_s();
  EXPECT_LE(execute_s, wall_s);
  EXPECT_GE(execute_s, 0.02 * static_cast<double>(steps.size()));  // each ran its modelled time
  ASSERT_EQ(got.size(), steps.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].step_id(), i + 1);
    EXPECT_EQ(got[i].error(), "");
    EXPECT_EQ(got[i].sampled_size(), 3);
  }
  EXPECT_EQ(Tokens(got), Tokens(want));
}

TEST(WorkerServiceOverlap, ARefusedStepIsAnsweredInItsPlaceAndTheRestServed) {
  SimModel model;
  SimRunner runner(model.Options(true, 0.002));
  Served served(runner);
  std::vector<ferry::v1::StepRequest> steps = {Step(1, 2), Step(2, 2), Step(3, 2), Step(4, 2)};
  steps[2].mutable_scheduled(0)->set_seq_id(99);  // unknown sequence: refused at Submit
  const auto got = Drive(served, steps, 2);
  ASSERT_EQ(got.size(), 4u);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].step_id(), i + 1);
  EXPECT_EQ(got[0].error(), "");
  EXPECT_EQ(got[1].error(), "");
  EXPECT_EQ(got[2].error(), "sequence 99: unknown");
  EXPECT_EQ(got[3].error(), "");
  EXPECT_EQ(got[3].sampled_size(), 2);
}

TEST(WorkerServiceOverlap, AStreamEndingWithStepsOutstandingLeavesNothingBehind) {
  SimModel model;
  SimRunner runner(model.Options(true, 0.3));
  Served served(runner);
  {
    grpc::ClientContext context;
    auto stream = served.stub->Step(&context);
    ASSERT_TRUE(stream->Write(Step(1, 2)));
    ASSERT_TRUE(stream->Write(Step(2, 2)));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_GT(served.StepRunningSeconds(), 0.05);  // the oldest step, running on the modelled device
    context.TryCancel();                           // the scheduler goes away mid-step
    ferry::v1::StepResult ignored;
    while (stream->Read(&ignored)) {
    }
    stream->Finish();
  }
  // A new scheduler: the old steps were collected (the runner holds none), the sequences forgotten.
  const auto got = Drive(served, {Step(1, 2), Step(2, 2)}, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].error(), "");
  EXPECT_EQ(got[1].error(), "");
  EXPECT_EQ(served.StepRunningSeconds(), 0.0);
}

}  // namespace
}  // namespace ferry::worker
