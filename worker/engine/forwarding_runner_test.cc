// A wrapper built on ForwardingRunner passes the whole contract through (overlap included) and
// enters its context (the GPU plugin: the runner's device) before every call that drives the runner.
#include "worker/engine/forwarding_runner.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ferry::worker {
namespace {

// Records each call it gets, and what the wrapper had entered when it came.
class RecordingRunner final : public ModelRunner {
 public:
  explicit RecordingRunner(const int* entered) : entered_(entered) { info_.model = "recorded"; }
  const ModelInfo& info() const override { return info_; }
  std::vector<SampledTokenOut> Step(const StepSpec&) override { return Record("Step", {{1, 11}}); }
  std::vector<PromptLogprobsOut> TakePromptLogprobs() override {
    Record("TakePromptLogprobs", {});
    return {{1, 1, {}}};
  }
  SpeculationCounts TakeSpeculationCounts() override {
    Record("TakeSpeculationCounts", {});
    return {3, 4, 5};
  }
  bool healthy() const override { return false; }
  bool supports_overlap() const override { return true; }
  void Submit(const StepSpec&) override { Record("Submit", {}); }
  std::vector<SampledTokenOut> Collect() override { return Record("Collect", {{2, 22}}); }
  bool Ready() const override {
    calls_.push_back("Ready@" + std::to_string(*entered_));
    return false;
  }
  void ForgetAll() override { Record("ForgetAll", {}); }
  void LoadLora(const std::string& name, const std::string& path) override { Record("LoadLora " + name + "=" + path, {}); }
  void UnloadLora(const std::string& name) override { Record("UnloadLora " + name, {}); }
  std::vector<std::string> LoraNames() const override {
    calls_.push_back("LoraNames@" + std::to_string(*entered_));
    return {"a", "b"};
  }

  std::vector<std::string>& calls() const { return calls_; }

 private:
  std::vector<SampledTokenOut> Record(const std::string& name, std::vector<SampledTokenOut> out) {
    calls_.push_back(name + "@" + std::to_string(*entered_));
    return out;
  }
  const int* entered_;
  ModelInfo info_;
  mutable std::vector<std::string> calls_;
};

// A wrapper that counts its Enter calls, as the GPU plugin binds its device there.
class CountingWrapper final : public ForwardingRunner {
 public:
  CountingWrapper() : ForwardingRunner(inner_), inner_(&entered_) {}
  const RecordingRunner& inner() const { return inner_; }
  int entered() const { return entered_; }

 protected:
  void Enter() const override { ++entered_; }

 private:
  mutable int entered_ = 0;
  RecordingRunner inner_;
};

TEST(ForwardingRunnerTest, ForwardsTheWholeContractEnteringBeforeEachDrivingCall) {
  CountingWrapper w;
  ModelRunner& r = w;
  EXPECT_EQ(r.info().model, "recorded");
  EXPECT_FALSE(r.healthy());
  EXPECT_TRUE(r.supports_overlap()) << "a wrapper must not hide overlap";
  EXPECT_EQ(w.entered(), 0) << "info, healthy and supports_overlap are read from any thread: nothing entered";
  EXPECT_EQ(r.Step({}).at(0).token_id, 11);
  r.Submit({});
  EXPECT_FALSE(r.Ready());
  EXPECT_EQ(r.Collect().at(0).token_id, 22);
  EXPECT_EQ(r.TakePromptLogprobs().size(), 1u);
  EXPECT_EQ(r.TakeSpeculationCounts().num_accepted_tokens, 5);
  r.ForgetAll();
  r.LoadLora("x", "/p");
  EXPECT_EQ(r.LoraNames(), (std::vector<std::string>{"a", "b"}));
  r.UnloadLora("x");
  // Each call reached the runner after exactly one more Enter.
  EXPECT_EQ(w.inner().calls(), (std::vector<std::string>{"Step@1", "Submit@2", "Ready@3", "Collect@4",
                                                          "TakePromptLogprobs@5", "TakeSpeculationCounts@6",
                                                          "ForgetAll@7", "LoadLora x=/p@8", "LoraNames@9",
                                                          "UnloadLora x@10"}));
}

}  // namespace
}  // namespace ferry::worker
