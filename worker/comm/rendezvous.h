// A value only a live rank 0 can hand out: the root of a group's rendezvous.
//
// A rendezvous directory outlives the processes that used it (Gloo's FileStore never deletes a
// key; a file rank 0 wrote stays after it died), so a file alone cannot tell a restarted rank
// whether what it reads belongs to the incarnation of rank 0 that is running now. A socket can:
// rank 0 listens on a TCP port, publishes "host port" in `<dir>/<name>.addr`, and answers every
// connection with the value. A reader that finds the file of a dead rank 0 is refused (or meets
// another program on a reused port, or a stopped process that never answers) and reads the file
// again until the live rank 0 has replaced it or the deadline passes.
//
// The Gloo communicator hands out a random group generation this way (every rank then keys the
// FileStore under it); the GPU plugin hands out the NCCL unique id.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

namespace ferry::worker {

class RendezvousHost {
 public:
  // Listens on `interface_address` (port chosen by the kernel), publishes the address file
  // (written, then renamed over any earlier one) and serves `value` from a thread until
  // destroyed. Throws CommError if it cannot listen or publish.
  RendezvousHost(const std::filesystem::path& dir, const std::string& name, const std::string& interface_address,
                 std::string value);
  // Stops serving; the address file stays (a reader is refused and waits for the next rank 0).
  ~RendezvousHost();

  RendezvousHost(const RendezvousHost&) = delete;
  RendezvousHost& operator=(const RendezvousHost&) = delete;

 private:
  void Serve();

  const std::string name_;
  const std::string value_;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// The value of the live RendezvousHost publishing `<dir>/<name>.addr`. Throws CommError once
// `deadline` passes, naming the last reason a try failed (no file yet, refused, no answer).
std::string FetchFromRendezvousHost(const std::filesystem::path& dir, const std::string& name,
                                    std::chrono::steady_clock::time_point deadline);

}  // namespace ferry::worker
