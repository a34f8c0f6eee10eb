// NCCL communicator: plain C++ over the CUDA runtime and NCCL host APIs; no
// kernels of our own.
#include "worker/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <stdexcept>
#include <string>

namespace ferry::worker {
namespace {

void CheckCuda(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorName(status) + ": " +
                             cudaGetErrorString(status));
  }
}

// `comm` may be null (before the communicator exists); NCCL's last-error text
// then comes from the most recent failure on this thread.
void CheckNccl(ncclResult_t status, const char* call, ncclComm_t comm = nullptr) {
  if (status != ncclSuccess) {
    std::string message = std::string(call) + " failed: " + ncclGetErrorString(status);
    const char* detail = ncclGetLastError(comm);
    if (detail != nullptr && detail[0] != '\0') message += std::string(" (") + detail + ")";
    throw std::runtime_error(message);
  }
}

#define FERRY_CUDA_CHECK(call) CheckCuda((call), #call)
#define FERRY_NCCL_CHECK(call) CheckNccl((call), #call, comm_)

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int size, ncclComm_t comm, cudaStream_t stream)
      : rank_(rank), size_(size), comm_(comm), stream_(stream) {
    try {
      FERRY_CUDA_CHECK(cudaMalloc(&barrier_scratch_, sizeof(float)));
    } catch (...) {
      ncclCommDestroy(comm_);
      throw;
    }
  }

  // Destructors must not throw; a failure here would only leak.
  ~NcclCommunicator() override {
    cudaFree(barrier_scratch_);
    ncclCommDestroy(comm_);
  }

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void AllReduceSum(float* data, size_t count) override {  // device [count]
    if (count == 0) return;
    FERRY_NCCL_CHECK(ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_));
  }

  void AllGather(const float* send, size_t count, float* recv) override {  // device send [count], recv [size * count]
    if (count == 0) return;
    FERRY_NCCL_CHECK(ncclAllGather(send, recv, count, ncclFloat32, comm_, stream_));
  }

  void Broadcast(void* data, size_t bytes, int root) override {  // device [bytes]
    if (root < 0 || root >= size_) {
      throw std::runtime_error("Broadcast: root " + std::to_string(root) + " out of range for a group of size " +
                               std::to_string(size_));
    }
    if (bytes == 0) return;
    FERRY_NCCL_CHECK(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_));
  }

  // NCCL has no barrier; the usual substitute is a one-element allreduce that
  // the host then waits for, since no rank's copy can finish before all join.
  void Barrier() override {
    FERRY_NCCL_CHECK(ncclAllReduce(barrier_scratch_, barrier_scratch_, 1, ncclFloat32, ncclSum, comm_, stream_));
    FERRY_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  int rank_;
  int size_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  float* barrier_scratch_ = nullptr;  // device [1]
};

}  // namespace

std::string GetNcclUniqueId() {
  ncclUniqueId id;
  CheckNccl(ncclGetUniqueId(&id), "ncclGetUniqueId(&id)");
  return std::string(id.internal, sizeof(id.internal));
}

std::unique_ptr<Communicator> CreateNcclCommunicator(int rank, int size, const std::string& unique_id, int device,
                                                     cudaStream_t stream) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw std::runtime_error("NCCL communicator: rank " + std::to_string(rank) + " out of range for size " +
                             std::to_string(size));
  }
  ncclUniqueId id;
  if (unique_id.size() != sizeof(id.internal)) {
    throw std::runtime_error("NCCL communicator: unique id must be " + std::to_string(sizeof(id.internal)) +
                             " bytes, got " + std::to_string(unique_id.size()));
  }
  unique_id.copy(id.internal, sizeof(id.internal));
  CheckCuda(cudaSetDevice(device), ("cudaSetDevice(" + std::to_string(device) + ")").c_str());
  ncclComm_t comm = nullptr;
  CheckNccl(ncclCommInitRank(&comm, size, id, rank), "ncclCommInitRank(&comm, size, id, rank)");
  return std::make_unique<NcclCommunicator>(rank, size, comm, stream);
}

}  // namespace ferry::worker
