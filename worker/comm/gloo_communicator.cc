// Gloo-backed communicator: CPU buffers, TCP between processes (normally on
// loopback), rendezvous through a FileStore directory. A group of one rank
// gets a local communicator that touches neither the network nor the store.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iomanip>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/comm/rendezvous.h"

namespace ferry::worker {
namespace {

// size == 1: every collective is the identity (or a copy), so single-rank
// serving pays nothing and needs no rendezvous directory.
class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void AllReduceSum(float*, size_t) override {}
  void AllGather(const float* send, size_t count, float* recv) override {
    if (send != recv && count > 0) std::memmove(recv, send, count * sizeof(float));
  }
  void Broadcast(void*, size_t, int root) override {
    if (root != 0) {
      throw std::runtime_error("Broadcast: root " + std::to_string(root) + " out of range for a group of size 1");
    }
  }
  void Barrier() override {}
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::Context> context, std::chrono::milliseconds timeout)
      : context_(std::move(context)), timeout_(timeout) {}

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  void AllReduceSum(float* data, size_t count) override {
    if (count == 0) return;  // Gloo rejects empty buffers; every rank skips alike.
    if (count <= kSmallAllReduceMaxCount) {
      GatherThenSum(data, count);
    } else {
      RingAllReduce(data, count);
    }
  }

  void AllGather(const float* send, size_t count, float* recv) override {
    Gather("AllGather", send, count, recv);
  }

  void Broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= size()) {
      throw std::runtime_error("Broadcast: root " + std::to_string(root) + " out of range for a group of size " +
                               std::to_string(size()));
    }
    if (bytes == 0) return;
    Run("Broadcast", [&](uint32_t tag) {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(static_cast<uint8_t*>(data), bytes);
      opts.setRoot(root);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  void Barrier() override {
    Run("Barrier", [&](uint32_t tag) {
      gloo::BarrierOptions opts(context_);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  // Every rank issues the same collectives in the same order, so a per-call
  // counter yields matching tags without any coordination. After a failure
  // the TCP pairs are in an undefined state; refuse further use rather than
  // risk pairing mismatched messages. Gloo reports a lost peer (connection
  // closed or reset) and a silent one (the timeout) alike as an exception
  // from the collective: both mean the group is broken.
  template <typename Fn>
  void Run(const char* what, Fn&& fn) {
    if (!failure_.empty()) {
      throw CommError(std::string("Gloo ") + what + " on a communicator that already failed: " + failure_);
    }
    try {
      fn(next_tag_++);
    } catch (const std::exception& e) {
      failure_ = std::string(what) + " (rank " + std::to_string(rank()) + " of " + std::to_string(size()) +
                 ", timeout " + std::to_string(timeout_.count()) + " ms): " + e.what();
      throw CommError("Gloo " + failure_);
    }
  }

  // Small vectors (decode activations) are latency-bound: Gloo's ring takes
  // at least 2 * (size - 1) sequential hops, an allgather size - 1. Every rank
  // then adds the same values in the same (rank) order, so all agree bitwise.
  static constexpr size_t kSmallAllReduceMaxCount = 16384;

  void GatherThenSum(float* data, size_t count) {
    gathered_.resize(count * static_cast<size_t>(size()));
    Gather("AllReduceSum", data, count, gathered_.data());
    std::copy_n(gathered_.data(), count, data);
    for (int r = 1; r < size(); ++r) {
      const float* part = gathered_.data() + static_cast<size_t>(r) * count;
      for (size_t i = 0; i < count; ++i) data[i] += part[i];
    }
  }

  // `what` names the public call in error messages.
  void Gather(const char* what, const float* send, size_t count, float* recv) {
    if (count == 0) return;
    Run(what, [&](uint32_t tag) {
      gloo::AllgatherOptions opts(context_);
      // Gloo's input pointer is non-const but it only reads from it.
      opts.setInput(const_cast<float*>(send), count);
      opts.setOutput(recv, count * static_cast<size_t>(size()));
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  // Large vectors are bandwidth-bound. Ring: each element is summed once, on
  // one rank, and the finished bytes are copied around, so ranks agree bitwise.
  void RingAllReduce(float* data, size_t count) {
    Run("AllReduceSum", [&](uint32_t tag) {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data, count);
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
  }

  std::shared_ptr<gloo::Context> context_;
  std::chrono::milliseconds timeout_;
  uint32_t next_tag_ = 0;
  std::string failure_;
  std::vector<float> gathered_;  // [size * count] scratch for GatherThenSum
};

void Validate(const GlooOptions& o) {
  if (o.size < 1) throw std::runtime_error("Gloo communicator: size must be >= 1, got " + std::to_string(o.size));
  if (o.rank < 0 || o.rank >= o.size) {
    throw std::runtime_error("Gloo communicator: rank " + std::to_string(o.rank) + " out of range for size " +
                             std::to_string(o.size));
  }
  if (o.timeout_s <= 0) {
    throw std::runtime_error("Gloo communicator: timeout_s must be > 0, got " + std::to_string(o.timeout_s));
  }
  if (o.size > 1 && o.store_dir.empty()) {
    throw std::runtime_error("Gloo communicator: store_dir is required when size > 1");
  }
}

std::string NewGeneration() {
  std::random_device device;
  std::ostringstream out;
  out << std::hex << std::setfill('0') << std::setw(8) << device() << std::setw(8) << device();
  return out.str();
}

// Rank 0 draws a generation and hands it out through a RendezvousHost, which
// only it, alive, can serve; every rank keys the FileStore under
// "<prefix>.<generation>", so keys left by an earlier incarnation of the group
// are never read. Rank 0's host lives until the mesh is connected: by then
// every other rank has fetched the generation.
std::shared_ptr<gloo::Context> Connect(const GlooOptions& o, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::filesystem::path dir = o.store_dir;
  std::filesystem::create_directories(dir);
  std::unique_ptr<RendezvousHost> host;
  std::string generation;
  if (o.rank == 0) {
    generation = NewGeneration();
    host = std::make_unique<RendezvousHost>(dir, o.prefix + ".generation", o.interface_address, generation);
  } else {
    generation = FetchFromRendezvousHost(dir, o.prefix + ".generation", deadline);
  }
  gloo::transport::tcp::attr attr;
  attr.hostname = o.interface_address;
  auto device = gloo::transport::tcp::CreateDevice(attr);
  // The store is only needed to swap listening addresses; once the mesh is
  // connected all traffic goes over the pairs.
  gloo::rendezvous::FileStore file_store(o.store_dir);
  gloo::rendezvous::PrefixStore store(o.prefix + "." + generation, file_store);
  auto context = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0) throw CommError("timed out before connecting (the generation came at the deadline)");
  context->setTimeout(left);
  context->connectFullMesh(store, device);
  return context;
}

}  // namespace

std::unique_ptr<Communicator> CreateGlooCommunicator(const GlooOptions& options) {
  Validate(options);
  if (options.size == 1) return std::make_unique<LocalCommunicator>();
  // A peer's death must reach the caller as CommError. Gloo writes with
  // writev, which cannot pass MSG_NOSIGNAL, so a write to a dead peer raises
  // SIGPIPE, whose default kills this rank (exit 141) before any error is seen
  // (issue #53): ignored for the process, as ferry-worker's main does too.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPIPE, &ignore, nullptr);
  const std::chrono::milliseconds timeout = std::chrono::seconds(options.timeout_s);
  try {
    return std::make_unique<GlooCommunicator>(Connect(options, timeout), timeout);
  } catch (const std::exception& e) {
    throw CommError("Gloo rendezvous failed for rank " + std::to_string(options.rank) + " of " +
                             std::to_string(options.size) + " (store_dir '" + options.store_dir + "', prefix '" +
                             options.prefix + "', address " + options.interface_address + ", timeout " +
                             std::to_string(options.timeout_s) + " s): " + e.what());
  }
}

}  // namespace ferry::worker
