#include "gateway/http/connection_watch.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace ferry::gateway::http {
namespace {

// Address and port of an AF_INET / AF_INET6 socket address; false for others.
bool AddressOf(const sockaddr_storage& a, std::string* address, int* port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    inet_ntop(AF_INET, &in.sin_addr, text, sizeof(text));
    *port = ntohs(in.sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a);
    inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof(text));
    *port = ntohs(in6.sin6_port);
  } else {
    return false;
  }
  *address = text;
  return true;
}

bool Matches(int fd, const std::string& peer_addr, int peer_port, int local_port) {
  sockaddr_storage local{}, peer{};
  socklen_t local_len = sizeof(local), peer_len = sizeof(peer);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) {
    return false;  // not a socket, or not connected
  }
  std::string address;
  int port = 0;
  if (!AddressOf(local, &address, &port) || port != local_port) return false;
  return AddressOf(peer, &address, &port) && port == peer_port && address == peer_addr;
}

}  // namespace

int FindConnectionSocket(const std::string& peer_addr, int peer_port, int local_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  const int own = dirfd(dir);
  while (const dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || end == entry->d_name || fd == own) continue;
    if (Matches(static_cast<int>(fd), peer_addr, peer_port, local_port)) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

int ConnectionSocketOfThisThread(const std::string& peer_addr, int peer_port, int local_port) {
  struct Remembered {
    std::string peer_addr;
    int peer_port = -1;
    int local_port = -1;
    int socket = -1;
  };
  thread_local Remembered last;
  if (last.socket >= 0 && last.peer_port == peer_port && last.local_port == local_port &&
      last.peer_addr == peer_addr && Matches(last.socket, peer_addr, peer_port, local_port)) {
    return last.socket;
  }
  last = Remembered{peer_addr, peer_port, local_port, FindConnectionSocket(peer_addr, peer_port, local_port)};
  return last.socket;
}

ConnectionWatch::ConnectionWatch(int socket, std::function<void()> on_gone) : on_gone_(std::move(on_gone)) {
  if (socket < 0) return;
  wake_fd_ = eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) return;
  thread_ = std::thread([this, socket] { Run(socket); });
}

ConnectionWatch::~ConnectionWatch() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  if (wake_fd_ >= 0) close(wake_fd_);
}

void ConnectionWatch::Run(int socket) {
  // POLLRDHUP: the peer closed its side (a client that gives up closes the
  // connection). Bytes of a pipelined next request raise only POLLIN, which is
  // not asked for. Hang-ups and errors are reported whatever is asked.
  pollfd fds[2] = {{socket, POLLRDHUP, 0}, {wake_fd_, POLLIN, 0}};
  while (true) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;  // stopped
    if (fds[0].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
      gone_.store(true);
      on_gone_();
      return;
    }
  }
}

}  // namespace ferry::gateway::http
