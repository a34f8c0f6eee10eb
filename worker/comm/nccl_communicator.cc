// NCCL communicator: plain C++ over the CUDA runtime and NCCL host APIs; no
// kernels of our own.
#include "worker/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

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

using Clock = std::chrono::steady_clock;

// Polls rather than blocks (a blocking wait on a dead peer never returns): every few hundred
// microseconds once the first thousand spins found nothing.
void Pause(int spins) {
  if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(200));
}

// The communicator is non-blocking (ncclConfig_t::blocking = 0): NCCL calls may return
// ncclInProgress and finish in the background, and nothing NCCL does waits forever on the
// host. A collective returns once enqueued on the stream (the enqueue itself bounded by the
// timeout): the host does not wait for it, since the next kernel on the stream does, and a
// forward pass issues two a layer. Completion and a peer's failure are the stream waiter's:
// the runner's wait for its step, bounded by its step timeout, polls PollAsyncError, which
// aborts the communicator (ncclCommAbort frees the kernels stuck on a dead peer) and throws
// CommError on an asynchronous error. Barrier alone waits for its collective on the host.
class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int size, ncclComm_t comm, cudaStream_t stream, std::chrono::seconds timeout)
      : rank_(rank), size_(size), comm_(comm), stream_(stream), timeout_(timeout) {
    try {
      FERRY_CUDA_CHECK(cudaMalloc(&barrier_scratch_, sizeof(float)));
      FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    } catch (...) {
      cudaFree(barrier_scratch_);
      ncclCommAbort(comm_);
      throw;
    }
  }

  // Destructors must not throw; a failure here would only leak. A healthy communicator is
  // finalized (flushing what was issued) within the timeout, else aborted.
  ~NcclCommunicator() override {
    cudaEventDestroy(done_);
    cudaFree(barrier_scratch_);
    if (!failure_.empty()) return;  // aborted already
    ncclResult_t state = ncclCommFinalize(comm_);
    const auto deadline = Clock::now() + timeout_;
    for (int spins = 0; state == ncclInProgress && Clock::now() < deadline; ++spins) {
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
      Pause(spins);
    }
    if (state == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void AllReduceSum(float* data, size_t count) override {  // device [count]
    if (count == 0) return;
    Collective("ncclAllReduce", [&] { return ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_); });
  }

  void AllGather(const float* send, size_t count, float* recv) override {  // device send [count], recv [size * count]
    if (count == 0) return;
    Collective("ncclAllGather", [&] { return ncclAllGather(send, recv, count, ncclFloat32, comm_, stream_); });
  }

  void Broadcast(void* data, size_t bytes, int root) override {  // device [bytes]
    if (root < 0 || root >= size_) {
      throw std::runtime_error("Broadcast: root " + std::to_string(root) + " out of range for a group of size " +
                               std::to_string(size_));
    }
    if (bytes == 0) return;
    Collective("ncclBroadcast", [&] { return ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_); });
  }

  // NCCL has no barrier; the usual substitute is a one-element allreduce that
  // the host then waits for, since no rank's copy can finish before all join.
  void Barrier() override {
    if (IsCapturing()) throw std::runtime_error("NCCL Barrier: cannot wait inside a CUDA graph capture");
    const auto deadline = Clock::now() + timeout_;
    Collective("ncclAllReduce (Barrier)", [&] {
      return ncclAllReduce(barrier_scratch_, barrier_scratch_, 1, ncclFloat32, ncclSum, comm_, stream_);
    });
    WaitForCompletion("ncclAllReduce (Barrier)", deadline);
  }

 private:
  template <typename Enqueue>
  void Collective(const char* what, Enqueue&& enqueue) {
    if (!failure_.empty()) throw CommError(std::string("NCCL ") + what + " on a communicator that failed: " + failure_);
    const auto deadline = Clock::now() + timeout_;
    ncclResult_t status = enqueue();
    for (int spins = 0; status == ncclInProgress; ++spins) {  // the enqueue finishes in the background
      if (Clock::now() > deadline) Abort(what, "the enqueue did not finish");
      const ncclResult_t polled = ncclCommGetAsyncError(comm_, &status);
      if (polled != ncclSuccess) status = polled;
      Pause(spins);
    }
    if (status != ncclSuccess) Abort(what, ncclGetErrorString(status));
  }

 public:
  void PollAsyncError() override {
    if (!failure_.empty()) throw CommError("NCCL communicator failed: " + failure_);
    ncclResult_t async = ncclSuccess;
    const ncclResult_t polled = ncclCommGetAsyncError(comm_, &async);
    if (polled != ncclSuccess) async = polled;
    if (async != ncclSuccess && async != ncclInProgress) Abort("a collective", ncclGetErrorString(async));
  }

 private:

  // Everything enqueued on the stream so far, the collective last, has finished.
  void WaitForCompletion(const char* what, Clock::time_point deadline) {
    FERRY_CUDA_CHECK(cudaEventRecord(done_, stream_));
    for (int spins = 0;; ++spins) {
      const cudaError_t done = cudaEventQuery(done_);
      if (done == cudaSuccess) return;
      if (done != cudaErrorNotReady) FERRY_CUDA_CHECK(done);
      ncclResult_t async = ncclSuccess;
      const ncclResult_t polled = ncclCommGetAsyncError(comm_, &async);
      if (polled != ncclSuccess) async = polled;
      if (async != ncclSuccess && async != ncclInProgress) Abort(what, ncclGetErrorString(async));
      if (Clock::now() > deadline) Abort(what, "did not complete (a peer dead, stopped or missing the call?)");
      Pause(spins);
    }
  }

  [[noreturn]] void Abort(const char* what, const std::string& cause) {
    const char* detail = ncclGetLastError(comm_);
    failure_ = std::string(what) + " (rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ", timeout " +
               std::to_string(timeout_.count()) + " s): " + cause;
    if (detail != nullptr && detail[0] != '\0') failure_ += std::string(" (") + detail + ")";
    ncclCommAbort(comm_);  // the group is unusable; aborting frees the kernels waiting on peers
    throw CommError("NCCL " + failure_);
  }

  bool IsCapturing() const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    FERRY_CUDA_CHECK(cudaStreamIsCapturing(stream_, &status));
    return status != cudaStreamCaptureStatusNone;
  }

  int rank_;
  int size_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  std::chrono::seconds timeout_;
  std::string failure_;                // set once aborted
  float* barrier_scratch_ = nullptr;  // device [1]
  cudaEvent_t done_ = nullptr;
};

// Joins the group without blocking the host: a rank that never comes makes the others time
// out here instead of waiting forever.
ncclComm_t InitNonBlocking(int rank, int size, const ncclUniqueId& id, int timeout_s) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t status = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  const auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
  for (int spins = 0; status == ncclInProgress && comm != nullptr; ++spins) {
    if (Clock::now() > deadline) break;
    const ncclResult_t polled = ncclCommGetAsyncError(comm, &status);
    if (polled != ncclSuccess) status = polled;
    Pause(spins);
  }
  if (status == ncclSuccess) return comm;
  const std::string cause = status == ncclInProgress ? "not every rank joined within " + std::to_string(timeout_s) + " s"
                                                     : std::string(ncclGetErrorString(status));
  const char* detail = ncclGetLastError(comm);
  std::string message = "NCCL communicator: rank " + std::to_string(rank) + " of " + std::to_string(size) +
                        " could not join its group: " + cause;
  if (detail != nullptr && detail[0] != '\0') message += std::string(" (") + detail + ")";
  if (comm != nullptr) ncclCommAbort(comm);
  throw CommError(message);
}

}  // namespace

std::string GetNcclUniqueId() {
  ncclUniqueId id;
  CheckNccl(ncclGetUniqueId(&id), "ncclGetUniqueId(&id)");
  return std::string(id.internal, sizeof(id.internal));
}

std::unique_ptr<Communicator> CreateNcclCommunicator(int rank, int size, const std::string& unique_id, int device,
                                                     cudaStream_t stream, int timeout_s) {
  if (timeout_s <= 0) {
    throw std::runtime_error("NCCL communicator: timeout_s must be > 0, got " + std::to_string(timeout_s));
  }
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
  return std::make_unique<NcclCommunicator>(rank, size, InitNonBlocking(rank, size, id, timeout_s), stream,
                                            std::chrono::seconds(timeout_s));
}

}  // namespace ferry::worker
