// A ModelRunner that forwards the whole contract to another runner: the base of wrappers that add
// to a runner without being one (the GPU plugin's metrics and device binding, worker/gpu/plugin.cc).
// Forwarding every call here, once, is what keeps a wrapper from hiding part of the contract: a
// wrapper that forwarded only Step made the worker see supports_overlap() false and never overlap.
#pragma once

#include <vector>

#include "worker/engine/model_runner.h"

namespace ferry::worker {

class ForwardingRunner : public ModelRunner {
 public:
  // `target` outlives this runner's calls (a member of the derived class is fine: it is not used
  // before the derived constructor has run).
  explicit ForwardingRunner(ModelRunner& target) : target_(target) {}

  const ModelInfo& info() const override { return target_.info(); }
  std::vector<SampledTokenOut> Step(const StepSpec& step) override {
    Enter();
    return target_.Step(step);
  }
  std::vector<PromptLogprobsOut> TakePromptLogprobs() override {
    Enter();
    return target_.TakePromptLogprobs();
  }
  SpeculationCounts TakeSpeculationCounts() override {
    Enter();
    return target_.TakeSpeculationCounts();
  }
  bool healthy() const override { return target_.healthy(); }
  bool supports_overlap() const override { return target_.supports_overlap(); }
  void Submit(const StepSpec& step) override {
    Enter();
    target_.Submit(step);
  }
  std::vector<SampledTokenOut> Collect() override {
    Enter();
    return target_.Collect();
  }
  bool Ready() const override {
    Enter();
    return target_.Ready();
  }
  void ForgetAll() override {
    Enter();
    target_.ForgetAll();
  }
  void LoadLora(const std::string& name, const std::string& path) override {
    Enter();
    target_.LoadLora(name, path);
  }
  void UnloadLora(const std::string& name) override {
    Enter();
    target_.UnloadLora(name);
  }
  std::vector<std::string> LoraNames() const override {
    Enter();
    return target_.LoraNames();
  }

 protected:
  // Called on the calling thread before each call that drives the runner (all but info, healthy
  // and supports_overlap, which any thread may read): where a device runner makes its device the
  // thread's current one. May throw; the call then fails with it.
  virtual void Enter() const {}

 private:
  ModelRunner& target_;
};

}  // namespace ferry::worker
