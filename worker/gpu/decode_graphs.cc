#include "worker/gpu/decode_graphs.h"

#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/paged_attention.h"
#include "worker/gpu/batch_builder.h"
#include "worker/gpu/cuda_model.h"

namespace ferry::worker::gpu {

std::vector<int32_t> DefaultGraphSizes(int32_t max_num_seqs) {
  std::vector<int32_t> sizes;
  for (int32_t s : {1, 2, 4}) {
    if (s <= max_num_seqs) sizes.push_back(s);
  }
  for (int32_t s = 8; s <= max_num_seqs; s += 8) sizes.push_back(s);
  if (sizes.empty() || sizes.back() != max_num_seqs) sizes.push_back(max_num_seqs);
  return sizes;
}

DecodeGraphs::~DecodeGraphs() {
  for (auto& [size, entry] : graphs_) cudaGraphExecDestroy(entry.exec);
}

void DecodeGraphs::Capture(CudaModel& model, BatchBuilder& builder, const std::vector<int32_t>& sizes,
                           cudaStream_t stream) {
  const int32_t kv_heads = model.shard().num_kv_heads;
  for (int32_t size : sizes) {
    if (size <= 0 || size > model.layout().max_seqs || graphs_.count(size)) continue;
    builder.Reset();
    builder.PadDecodeTo(size);  // all padding: the graph's inputs are rewritten before each replay
    // Splits depend only on the batch size, so a replay never needs a different grid.
    const int32_t splits = kernels::cuda::ChooseDecodeSplits(size, kv_heads, model.num_sms(), 0);
    const ForwardShape shape = builder.shape(splits);
    model.Upload(size, 0);
    model.Forward(shape);  // warm-up, eager
    FERRY_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaGraph_t graph = nullptr;
    FERRY_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      model.Forward(shape);
    } catch (...) {
      cudaStreamEndCapture(stream, &graph);  // leave capture mode so the stream stays usable
      if (graph != nullptr) cudaGraphDestroy(graph);
      throw;
    }
    FERRY_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    FERRY_CUDA_CHECK(status);
    graphs_[size] = Entry{exec, splits};
  }
  FERRY_CUDA_CHECK(cudaStreamSynchronize(stream));
}

int32_t DecodeGraphs::SizeFor(int32_t num_seqs) const {
  const auto it = graphs_.lower_bound(num_seqs);
  return it == graphs_.end() ? 0 : it->first;
}

void DecodeGraphs::Replay(int32_t size, cudaStream_t stream) const {
  FERRY_CUDA_CHECK(cudaGraphLaunch(graphs_.at(size).exec, stream));
}

}  // namespace ferry::worker::gpu
