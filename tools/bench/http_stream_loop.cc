#include "tools/bench/http_stream_loop.h"

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace ferry::bench {
namespace {

// One recv per ready socket per wake-up: a stream's events of one engine step fit easily, and a
// socket with more left stays ready (level-triggered) for the next epoll_wait.
constexpr size_t kReadBytes = 64 << 10;
constexpr int kMaxEvents = 256;

void Wake(int wake_fd) {
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = write(wake_fd, &one, sizeof one);
}

}  // namespace

StreamLoop::StreamLoop() : buffer_(kReadBytes) {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;  // nullptr marks the wake-up fd
  if (epoll_fd_ < 0 || wake_fd_ < 0 || epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev) != 0) {
    const int e = errno;
    if (epoll_fd_ >= 0) close(epoll_fd_);
    if (wake_fd_ >= 0) close(wake_fd_);
    throw std::system_error(e, std::generic_category(), "StreamLoop: epoll/eventfd");
  }
  thread_ = std::thread([this] { Run(); });
}

StreamLoop::~StreamLoop() {
  is_stopping_ = true;
  Wake(wake_fd_);
  thread_.join();
  close(wake_fd_);
  close(epoll_fd_);
}

void StreamLoop::Watch(int fd, StreamClock::time_point deadline, StreamReader* reader) {
  auto* w = new Watched{fd, reader, deadline, {}};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    new_watches_.push_back(w);
  }
  Wake(wake_fd_);
}

void StreamLoop::Run() {
  epoll_event events[kMaxEvents];
  while (!is_stopping_) {
    const int n = epoll_wait(epoll_fd_, events, kMaxEvents, MsUntilNextDeadline());
    for (int i = 0; i < n; ++i) {
      // A watch ended earlier in this batch is not in it twice: each fd has one entry per wait.
      if (events[i].data.ptr == nullptr) {
        TakeNewWatches();
      } else {
        Read(static_cast<Watched*>(events[i].data.ptr));
      }
    }
    ExpireDeadlines();
  }
  TakeNewWatches();
  while (!deadlines_.empty()) End(deadlines_.begin()->second, StreamEnd::kError, ECANCELED);
}

void StreamLoop::TakeNewWatches() {
  uint64_t count = 0;
  [[maybe_unused]] const ssize_t r = read(wake_fd_, &count, sizeof count);
  std::vector<Watched*> taken;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    taken.swap(new_watches_);
  }
  for (Watched* w : taken) {
    w->deadline_entry = deadlines_.emplace(w->deadline, w);
    epoll_event ev{};
    ev.events = EPOLLIN;  // level-triggered: see kReadBytes
    ev.data.ptr = w;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, w->fd, &ev) != 0) {
      const int e = errno;
      deadlines_.erase(w->deadline_entry);
      w->reader->OnEnd(StreamEnd::kError, e);
      delete w;
    }
  }
}

void StreamLoop::Read(Watched* w) {
  const ssize_t n = recv(w->fd, buffer_.data(), buffer_.size(), MSG_DONTWAIT);
  if (n > 0) {
    // One timestamp for everything this read brought: it all arrived by now.
    if (w->reader->OnBytes(std::string_view(buffer_.data(), static_cast<size_t>(n)), StreamClock::now())) {
      End(w, StreamEnd::kDone, 0);
    }
  } else if (n == 0) {
    End(w, StreamEnd::kClosed, 0);
  } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
    End(w, StreamEnd::kError, errno);
  }
}

void StreamLoop::End(Watched* w, StreamEnd end, int error_number) {
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, w->fd, nullptr);
  deadlines_.erase(w->deadline_entry);
  StreamReader* reader = w->reader;
  delete w;
  reader->OnEnd(end, error_number);
}

int StreamLoop::MsUntilNextDeadline() const {
  if (deadlines_.empty()) return -1;
  const auto left = deadlines_.begin()->first - StreamClock::now();
  if (left <= StreamClock::duration::zero()) return 0;
  // Rounded up: waking before the deadline would only spin.
  return static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(left).count());
}

void StreamLoop::ExpireDeadlines() {
  if (deadlines_.empty()) return;
  const auto now = StreamClock::now();
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    End(deadlines_.begin()->second, StreamEnd::kTimeout, 0);
  }
}

}  // namespace ferry::bench
