// One thread that reads many sockets (epoll), for ferry-bench's HTTP client: every SSE stream in
// flight is read here, so a token costs one read on this thread instead of waking the runner
// thread that sent the request (as blocking reads did). The thread owns each watched socket's
// reading and its deadline from Watch until the reader's OnEnd; the socket itself stays the
// caller's (the loop never closes it), so a keep-alive connection can carry the next request.
#pragma once

#include <sys/epoll.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

namespace ferry::bench {

using StreamClock = std::chrono::steady_clock;

enum class StreamEnd {
  kDone,     // the reader said it needs no more
  kClosed,   // the peer closed the connection (EOF)
  kError,    // recv failed (error_number says why), or the loop stopped
  kTimeout,  // the deadline passed first
};

// Called on the loop thread only.
class StreamReader {
 public:
  virtual ~StreamReader() = default;
  // `bytes` were read at `now`; returns true when the reader needs no more of them.
  virtual bool OnBytes(std::string_view bytes, StreamClock::time_point now) = 0;
  // The last call for this watch: the loop no longer reads the socket and never touches the
  // reader again, so the reader may be destroyed as soon as OnEnd lets its owner go on.
  virtual void OnEnd(StreamEnd end, int error_number) = 0;
};

class StreamLoop {
 public:
  StreamLoop();   // starts the thread (throws std::system_error when epoll cannot be set up)
  ~StreamLoop();  // stops and joins it; a watch still open ends with kError
  StreamLoop(const StreamLoop&) = delete;
  StreamLoop& operator=(const StreamLoop&) = delete;

  // Reads `fd` for `reader` until it is done, the peer closes, or `deadline`. Thread-safe; the
  // reader must live until its OnEnd, and `fd` must not be read or closed by anyone else until then.
  void Watch(int fd, StreamClock::time_point deadline, StreamReader* reader);

 private:
  struct Watched {
    int fd;
    StreamReader* reader;
    StreamClock::time_point deadline;
    std::multimap<StreamClock::time_point, Watched*>::iterator deadline_entry;  // set by the thread
  };

  void Run();
  void TakeNewWatches();
  void Read(Watched* w);
  void End(Watched* w, StreamEnd end, int error_number);
  int MsUntilNextDeadline() const;
  void ExpireDeadlines();

  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd: Watch and the destructor wake the thread through it
  std::atomic<bool> is_stopping_{false};
  std::mutex mutex_;
  std::vector<Watched*> new_watches_;  // guarded by mutex_; handed to the thread on wake-up
  // Owned by the thread:
  std::multimap<StreamClock::time_point, Watched*> deadlines_;  // every open watch, by deadline
  std::vector<char> buffer_;
  std::thread thread_;
};

}  // namespace ferry::bench
