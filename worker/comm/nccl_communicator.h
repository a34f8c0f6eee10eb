// NCCL-backed communicator for GPU tensor parallelism: one rank per GPU.
//
// Unlike the Gloo communicator, every pointer passed to its collectives is a
// DEVICE pointer, on the stream given at creation. Outside a CUDA graph
// capture each collective returns once it (and everything enqueued before it
// on the stream) has finished, within the timeout; inside a capture it is only
// enqueued, and the graph's replay is waited for by its caller.
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

// Collective: returns once all `size` ranks have called it with the same
// unique id, or throws CommError after `timeout_s` (a rank that never came).
// `device` is the CUDA ordinal this rank owns; it becomes the calling thread's
// current device. `stream` must belong to that device and outlive the
// communicator. Each collective outside a CUDA graph capture then waits for
// its completion with the same timeout, and throws CommError (the
// communicator aborted) on a timeout or an asynchronous NCCL error. Throws
// std::runtime_error on bad arguments.
std::unique_ptr<Communicator> CreateNcclCommunicator(int rank, int size, const std::string& unique_id, int device,
                                                     cudaStream_t stream, int timeout_s = 30);

}  // namespace ferry::worker
