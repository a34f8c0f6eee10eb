// The host side of the device sampler (kernels/cuda/sampler.h): packs a step's sampled rows
// into one buffer, uploads it with one copy, launches, and copies the results back, all on the
// runner's stream (no synchronisation: the step's readback waits for them).
//
// Buffer layout (SamplerPacker), fixed for (max_rows, max_entries, vocab):
//   [0, params_bytes)      SamplerRowParams[max_rows]
//   [params_bytes, total)  the arena, uint32 words: each row's bias entries, penalty entries and
//                          mask, one row after another; rows point into it by word offset.
// A step uploads the params region and the arena's used prefix only. Masks always fit (one per
// row); bias and penalty entries share max_entries per step, and a row whose entries do not fit
// is left to the host sampler (the caller counts it).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cuda/sampler.h"
#include "worker/engine/guided_decoding.h"
#include "worker/engine/model_runner.h"
#include "worker/engine/sampler.h"
#include "worker/gpu/device_buffer.h"

namespace ferry::worker::gpu {

// One row to sample, as the CPU Sampler::Sample takes it.
struct SamplerRowInput {
  const SamplingOptions* options = nullptr;
  const TokenCounts* counts = nullptr;  // null: no history (penalties are no-ops)
  int32_t sample_index = 0;             // tokens generated so far
  const TokenMask* mask = nullptr;      // allowed_token_ids or the guided mask; null: any id
  int32_t logits_row = 0;               // row of the device logits
};

// Plain host code: writes rows into a caller's buffer of total_bytes() (pinned in DeviceSampler,
// ordinary memory in tests).
class SamplerPacker {
 public:
  SamplerPacker(int32_t max_rows, int32_t max_entries, int32_t vocab);

  size_t params_bytes() const { return params_bytes_; }
  size_t total_bytes() const { return params_bytes_ + size_t(arena_words_) * 4; }
  int32_t mask_words() const { return mask_words_; }

  // Starts a step over `buffer` (total_bytes()).
  void Reset(void* buffer);
  // The row's slot (its index in the launch), or -1 when its bias and penalty entries do not fit
  // what is left of max_entries (nothing written). Throws std::invalid_argument for a mask not
  // over the vocabulary or a history id outside it.
  int32_t Add(const SamplerRowInput& row);

  int32_t num_rows() const { return num_rows_; }
  int32_t num_entries() const { return num_entries_; }
  // The prefix of the buffer to upload: the params region and the arena's used words.
  size_t used_bytes() const { return params_bytes_ + size_t(arena_used_) * 4; }

 private:
  std::vector<kernels::cuda::SamplerBias> BiasEntries(const SamplerRowInput& row) const;
  int32_t AppendWords(const void* data, size_t num_words);

  int32_t max_rows_, max_entries_, vocab_, mask_words_, arena_words_;
  size_t params_bytes_;
  kernels::cuda::SamplerRowParams* params_ = nullptr;
  uint32_t* arena_ = nullptr;
  int32_t num_rows_ = 0, num_entries_ = 0, arena_used_ = 0;
};

// The result of one row as the CPU sampler reports it (top logprobs only when asked for).
SampleResult ToSampleResult(const kernels::cuda::SamplerResult& r, const SamplingOptions& options, int32_t vocab);

// Whether min_tokens suppression leaves none of the mask's ids: the CPU sampler then samples them
// from their raw logits (the constraint wins over the bias and the suppression).
bool SuppressionEmptiesMask(const TokenMask& mask, const std::vector<int32_t>& suppressed_ids);

struct DeviceSamplerOptions {
  int32_t max_rows = 0;     // the runner's --max-num-seqs
  int32_t vocab = 0;
  // Bias and penalty entries per step: 8 bytes each, host and device. A penalised row carries
  // one per distinct token of its prompt and output.
  int32_t max_entries = 0;  // 0: 2,048 per row
};

// Owns the pinned staging buffer, its device copy, the scratch rows and the results.
class DeviceSampler {
 public:
  explicit DeviceSampler(const DeviceSamplerOptions& options);

  // Starts a step: the rows of the next Enqueue.
  void Begin() { packer_.Reset(host_.as<void>()); }
  int32_t Add(const SamplerRowInput& row) { return packer_.Add(row); }
  int32_t num_rows() const { return packer_.num_rows(); }
  // Upload, sample, download on `stream`; nothing when no row was added. Throws CudaError.
  void Enqueue(const float* logits,  // [rows, vocab] device
               cudaStream_t stream);
  // After the stream passed Enqueue's work.
  const kernels::cuda::SamplerResult& result(int32_t slot) const {
    return host_results_.as<kernels::cuda::SamplerResult>()[slot];
  }
  // Device memory this sampler holds.
  size_t device_bytes() const { return device_.bytes() + scratch_.bytes() + results_.bytes(); }

 private:
  int32_t vocab_;
  SamplerPacker packer_;
  PinnedBuffer host_;          // the packer's buffer
  DeviceBuffer device_;        // its copy
  DeviceBuffer scratch_;       // [max_rows, vocab] fp32
  DeviceBuffer results_;       // SamplerResult[max_rows]
  PinnedBuffer host_results_;  // SamplerResult[max_rows]
};

}  // namespace ferry::worker::gpu
