// Asks one ready worker's ferry.v1.Worker/Health every second (1 s deadline) on a thread of its
// own and remembers when it last answered ok. The supervisor reads that to find a worker that is
// alive but hung (a stopped process, a step stuck in a collective): a process that has not
// exited is not necessarily serving. One probe per worker incarnation: made once the worker is
// ready, destroyed before it is restarted, so a probe never spans two processes.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "common/tls.h"

namespace ferry::launch {

class WorkerProbe {
 public:
  // "host:port"; counts as answered ok now. tls: the launcher's identity when the workers serve
  // mutual TLS (--tls auto), else empty.
  explicit WorkerProbe(std::string address, const TlsFlags& tls = {});
  ~WorkerProbe();                             // stops the thread (within the 1 s deadline)
  WorkerProbe(const WorkerProbe&) = delete;
  WorkerProbe& operator=(const WorkerProbe&) = delete;

  // How long since the last ok answer (or since the probe was made).
  std::chrono::steady_clock::duration silent_for() const;

 private:
  void Run();

  const std::string address_;
  const TlsFlags tls_;
  std::atomic<std::chrono::steady_clock::rep> last_ok_;  // steady_clock ticks
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace ferry::launch
