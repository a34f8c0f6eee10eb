// Decode steps as CUDA graphs: one graph per batch size in a set, captured once after the KV
// cache exists (every pointer a graph bakes in is then fixed) and replayed each step, a batch
// padded up to the next captured size (padding rows write no K/V and attend to nothing).
// Each size's forward runs once eagerly before capture, so lazy module loading and cuBLAS
// heuristics never run inside a capture.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <vector>

namespace ferry::worker::gpu {

class BatchBuilder;
class CudaModel;

// vLLM's default capture sizes, up to max_num_seqs: 1, 2, 4, then multiples of 8.
std::vector<int32_t> DefaultGraphSizes(int32_t max_num_seqs);

class DecodeGraphs {
 public:
  DecodeGraphs() = default;
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  // Captures a graph per size (throws CudaError; a failed capture leaves the stream usable).
  void Capture(CudaModel& model, BatchBuilder& builder, const std::vector<int32_t>& sizes, cudaStream_t stream);
  // The smallest captured size >= num_seqs, or 0 when there is none.
  int32_t SizeFor(int32_t num_seqs) const;
  // Decode splits the graph of `size` was captured with.
  void Replay(int32_t size, cudaStream_t stream) const;
  bool empty() const { return graphs_.empty(); }

 private:
  struct Entry {
    cudaGraphExec_t exec = nullptr;
    int32_t splits = 1;
  };
  std::map<int32_t, Entry> graphs_;
};

}  // namespace ferry::worker::gpu
