// Collectives between the tensor-parallel ranks of one model replica. The
// engine calls these at fixed points of the forward pass; implementations are
// Gloo (CPU, TCP on loopback) and NCCL (GPU). No home-made collectives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace ferry::worker {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: data[i] = sum over ranks of data[i]. Every rank ends with
  // bitwise-identical values.
  virtual void AllReduceSum(float* data, size_t count) = 0;  // [count]
  // recv = concat over ranks (in rank order) of each rank's send.
  virtual void AllGather(const float* send, size_t count, float* recv) = 0;  // send [count], recv [size * count]
  // Copies root's bytes to every rank.
  virtual void Broadcast(void* data, size_t bytes, int root) = 0;
  virtual void Barrier() = 0;
};

struct GlooOptions {
  int rank = 0;
  int size = 1;
  // Rendezvous directory shared by all ranks (gloo::rendezvous::FileStore).
  std::string store_dir;
  // Distinguishes several groups using one store directory.
  std::string prefix = "ferry";
  std::string interface_address = "127.0.0.1";
  int timeout_s = 120;
};

// Blocks until all `size` ranks have joined. Throws std::runtime_error.
std::unique_ptr<Communicator> CreateGlooCommunicator(const GlooOptions& options);

}  // namespace ferry::worker
