// Collectives between the tensor-parallel ranks of one model replica. The
// engine calls these at fixed points of the forward pass; implementations are
// Gloo (CPU, TCP on loopback) and NCCL (GPU). No home-made collectives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace ferry::worker {

// The group is broken: a peer died, stopped, or did not join or answer within
// the timeout, or the transport failed. A communicator that threw it is
// unusable (every later call throws it again); only a new group, formed by
// restarting every rank, can serve. Distinct from other errors (a bad
// argument), which leave the group intact.
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

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
  // A device communicator's collectives are stream-ordered: they return once enqueued, and a
  // failure (a peer gone) shows later. The caller that waits for the stream polls this while it
  // waits; it throws CommError once the group has failed. A host communicator's collectives
  // complete before they return, so there is nothing to poll.
  virtual void PollAsyncError() {}
};

struct GlooOptions {
  int rank = 0;
  int size = 1;
  // Rendezvous directory shared by all ranks (gloo::rendezvous::FileStore).
  std::string store_dir;
  // Distinguishes several groups using one store directory.
  std::string prefix = "ferry";
  std::string interface_address = "127.0.0.1";
  // Bounds the rendezvous (a rank that never joins) and every collective (a
  // rank that dies, stops or never calls it).
  int timeout_s = 120;
};

// Blocks until all `size` ranks of one incarnation of the group have joined
// (README.md, "Rendezvous": an earlier incarnation's keys in store_dir are
// never used). Throws std::runtime_error on bad options, CommError when
// the group cannot form within timeout_s; collectives throw CommError.
std::unique_ptr<Communicator> CreateGlooCommunicator(const GlooOptions& options);

}  // namespace ferry::worker
