// CudaRunner's options, apart from cuda_runner.h so that ferry-worker (which loads the GPU
// engine as a plugin, worker/gpu_plugin.h) can fill them without CUDA headers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/engine/model_runner.h"

namespace ferry::worker::gpu {

struct CudaRunnerOptions {
  RunnerOptions runner;                 // model_dir, block_size, num_kv_blocks, max_model_len
  int32_t device = 0;                   // CUDA ordinal
  float gpu_memory_utilization = 0.9f;  // used when runner.num_kv_blocks == 0
  int32_t max_num_seqs = 256;
  int32_t max_num_batched_tokens = 8192;
  bool enforce_eager = false;           // no CUDA graphs
  std::vector<int32_t> cuda_graph_sizes;  // empty: DefaultGraphSizes(max_num_seqs)
  double step_timeout_s = 120;
  // Tensor parallelism over NCCL: rank tp_rank of tp_size, all given the same unique id
  // (GetNcclUniqueId on rank 0, passed out of band).
  int32_t tp_rank = 0;
  int32_t tp_size = 1;
  std::string nccl_unique_id;
  // Joining the NCCL group and each collective (--dist-timeout-s): past it the communicator is
  // aborted and the step fails with CommError.
  int32_t dist_timeout_s = 30;
  // Penalty and logit-bias entries the device sampler takes per step (one per distinct token of
  // a penalised sequence); rows past it are sampled on the host. 0: 2,048 per sequence.
  int32_t sampler_max_entries = 0;
};

// Why the GPU engine cannot run with `o` (naming the flag, its value and the limit); empty if it
// can. Checked before anything is allocated, so that a bad flag is refused at start rather than
// writing past a buffer or being ignored: every sequence of a step computes at least one token, so
// the token buffers (sized by --max-num-batched-tokens) must hold --max-num-seqs rows, and a CUDA
// graph pads a decode step to its size in both.
inline std::string CudaRunnerOptionsError(const CudaRunnerOptions& o) {
  if (!(o.gpu_memory_utilization > 0.f && o.gpu_memory_utilization <= 1.f)) {
    return "--gpu-memory-utilization " + std::to_string(o.gpu_memory_utilization) + " must be in (0, 1]";
  }
  if (o.max_num_seqs < 1 || o.max_num_batched_tokens < 1) {
    return "--max-num-seqs " + std::to_string(o.max_num_seqs) + " and --max-num-batched-tokens " +
           std::to_string(o.max_num_batched_tokens) + " must be >= 1";
  }
  if (o.max_num_seqs > o.max_num_batched_tokens) {
    return "--max-num-seqs " + std::to_string(o.max_num_seqs) + " must be <= --max-num-batched-tokens " +
           std::to_string(o.max_num_batched_tokens) + " (each sequence of a step computes at least one token)";
  }
  for (const int32_t size : o.cuda_graph_sizes) {
    if (size < 1 || size > o.max_num_seqs) {
      return "CUDA graph size " + std::to_string(size) + " must be in [1, --max-num-seqs " +
             std::to_string(o.max_num_seqs) + "]";
    }
  }
  if (o.sampler_max_entries < 0) {
    return "sampler_max_entries " + std::to_string(o.sampler_max_entries) + " must be >= 0 (0: 2,048 per sequence)";
  }
  // The GPU engine computes in bfloat16 only; float32 would be silently ignored.
  if (o.runner.dtype != "auto" && o.runner.dtype != "bfloat16") {
    return "--dtype " + o.runner.dtype + " is not supported with --device cuda (bfloat16 or auto)";
  }
  return "";
}

}  // namespace ferry::worker::gpu
