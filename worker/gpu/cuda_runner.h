// The GPU ModelRunner: the same engine contract as the CPU CpuRunner (worker/model/README.md:
// StepSpec semantics, validation before any change, samples in scheduled order, seeded
// sampling), running CudaModel on one device. Greedy rows are picked by a device argmax;
// rows that need the full sampler (temperature, penalties, logprobs, guided decoding) are sampled
// on the device (device_sampler.h: the CPU Sampler's rules and distribution, under the CPU path's
// guided-decoding masks). Only a row whose penalty and bias entries overflow the device
// sampler's capacity copies its logits to the host for the CPU Sampler (StepTiming counts them).
//
// Memory (vLLM's meaning of --gpu-memory-utilization): weights, then activation buffers for
// max_num_batched_tokens / max_num_seqs, then the KV cache takes what is left of
// utilization * total device memory, reported as ModelInfo.num_kv_blocks.
//
// Failures: every CUDA and cuBLAS status is checked. A failed step throws (the worker turns it
// into the step's error status) and forgets the step's scheduled sequences, so the scheduler
// may re-send them; a sticky device error or a step that does not finish within
// step_timeout_s marks the runner unhealthy (healthy() false) and every later step fails fast.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <exception>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "worker/engine/model_runner.h"
#include "worker/engine/sampler.h"
#include "worker/engine/sequence_state.h"
#include "worker/gpu/batch_builder.h"
#include "worker/gpu/cuda_model.h"
#include "worker/gpu/cuda_runner_options.h"
#include "worker/gpu/decode_graphs.h"
#include "worker/gpu/device_sampler.h"
#include "worker/lora/lora_registry.h"

namespace ferry::worker::gpu {

// What one step cost, for metrics.
struct StepTiming {
  enum class Phase { kDecode, kPrefill, kMixed } phase = Phase::kDecode;
  double gpu_seconds = 0;   // between events around the step's device work
  double wall_seconds = 0;  // Step() from entry to return
  bool graph = false;
  int32_t host_sampled_rows = 0;  // rows the CPU Sampler took (device sampler capacity full)
};

class CudaRunner final : public ModelRunner {
 public:
  explicit CudaRunner(const CudaRunnerOptions& options);
  ~CudaRunner() override;

  const ModelInfo& info() const override { return info_; }
  std::vector<SampledTokenOut> Step(const StepSpec& step) override;
  // Overlap (ModelRunner): Submit finishes the step before it (its samples are this one's
  // inputs), then launches this one without waiting; Collect waits for the oldest.
  bool supports_overlap() const override { return true; }
  void Submit(const StepSpec& step) override;
  std::vector<SampledTokenOut> Collect() override;
  bool Ready() const override;
  void ForgetAll() override { seqs_.Clear(); }
  // LoRA adapters (runner.lora.enable): the CPU engine's registry (worker/lora), bf16 weights, in
  // --max-loras device slots (lora_slots.h). Thread-safe against Step, as ModelRunner says.
  void LoadLora(const std::string& name, const std::string& path) override;
  void UnloadLora(const std::string& name) override;
  std::vector<std::string> LoraNames() const override;

  // Safe to read from any thread (health checks, metrics).
  bool healthy() const override { return healthy_.load(std::memory_order_relaxed); }
  // Only from the thread driving Step.
  // With runner.keep_logits: [num_sampled, vocab] in returned order, as CpuRunner::last_logits().
  const std::vector<float>& last_logits() const { return last_logits_; }
  // Seconds the device spent executing steps (sum of StepTiming::gpu_seconds).
  double busy_seconds() const { return busy_seconds_; }
  const CudaModel& model() const { return *model_; }
  void set_step_observer(std::function<void(const StepTiming&)> observer) { observer_ = std::move(observer); }

 private:
  using Sequence = SequenceState;
  struct Planned;  // one scheduled sequence's place in the device batch
  // A submitted step; at most one is launched and not finished at a time.
  struct InFlight {
    StepSpec step;
    std::vector<Planned> plan;
    StepTiming timing;
    std::chrono::steady_clock::time_point wall_start;
    bool finished = false;                // waited for and committed (or failed)
    std::vector<SampledTokenOut> samples;
    std::exception_ptr error;             // what Collect throws
  };

  int32_t KvBlocksFromUtilization() const;
  void Validate(const StepSpec& step) const;
  void Finish(InFlight& f);
  std::exception_ptr Failed(const StepSpec& step, const std::exception& e);
  std::vector<Planned> BuildBatch(const StepSpec& step);
  // Each scheduled sequence's adapter slot (-1: none), by seq_id, its adapter uploaded to the slot
  // first when it was not resident; empty without LoRA.
  void PlaceAdapters(const StepSpec& step);
  void Launch(const std::vector<Planned>& plan, StepTiming* timing);
  std::vector<SampledTokenOut> Commit(const StepSpec& step, const std::vector<Planned>& plan);
  void WaitForDevice(cudaEvent_t event);
  void OnFailure(const std::exception& e);

  CudaRunnerOptions options_;
  ModelInfo info_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<CudaModel> model_;
  std::unique_ptr<BatchBuilder> builder_;
  DecodeGraphs graphs_;
  // The sequences, with the vocabulary guided decoding walks (tokenizer.json; null: unsupported).
  SequenceTable seqs_;
  std::unique_ptr<LoraRegistry> lora_;  // null without --enable-lora
  std::unique_ptr<LoraSlotTable> lora_slots_;
  std::unordered_map<uint64_t, int32_t> seq_slot_;  // PlaceAdapters': this step's sequences' slots
  Sampler sampler_;                                 // the fallback
  std::unique_ptr<DeviceSampler> device_sampler_;   // every other row that is not plain greedy
  PinnedBuffer host_ids_;     // [max_num_seqs] argmax ids
  PinnedBuffer host_logits_;  // [rows, vocab] rows the host samples from (grown on demand)
  std::vector<float> last_logits_;
  std::deque<InFlight> in_flight_;  // submitted, not collected; oldest first
  std::atomic<bool> healthy_{true};
  std::string unhealthy_reason_;
  double busy_seconds_ = 0;
  std::function<void(const StepTiming&)> observer_;
};

}  // namespace ferry::worker::gpu
