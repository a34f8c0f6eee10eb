// CudaQwen2Runner's options, apart from cuda_runner.h so that ferry-worker (which loads the GPU
// engine as a plugin, worker/gpu_plugin.h) can fill them without CUDA headers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/model/model_runner.h"

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
};

}  // namespace ferry::worker::gpu
