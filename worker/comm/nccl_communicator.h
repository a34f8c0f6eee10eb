// NCCL-backed communicator for GPU tensor parallelism: one rank per GPU.
//
// Unlike the Gloo communicator, every pointer passed to its collectives is a
// DEVICE pointer, and each collective is only enqueued on the stream given at
// creation: it returns before the data has moved. Work later enqueued on that
// stream sees the result; the host must synchronize the stream before reading
// it. Barrier() is the exception: it returns only after all ranks reached it
// (and everything enqueued before it on the stream has finished).
//
// Only built where CUDA is (FERRY_HAVE_CUDA); target ferry_comm_nccl, which
// defines FERRY_HAVE_NCCL for its users.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "worker/comm/communicator.h"

namespace ferry::worker {

// Rank 0 calls this once per group and hands the bytes (NCCL_UNIQUE_ID_BYTES,
// 128) to every rank out of band, e.g. through the scheduler. Throws
// std::runtime_error.
std::string GetNcclUniqueId();

// Collective: blocks until all `size` ranks have called it with the same
// unique id (NCCL has no join timeout: a rank that never comes blocks the
// others). `device` is the CUDA ordinal this rank owns; it becomes the calling
// thread's current device. `stream` must belong to that device and outlive the
// communicator. Throws std::runtime_error naming the failed call.
std::unique_ptr<Communicator> CreateNcclCommunicator(int rank, int size, const std::string& unique_id, int device,
                                                     cudaStream_t stream);

}  // namespace ferry::worker
